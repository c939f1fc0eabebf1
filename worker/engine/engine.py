"""The Engine: one loaded model and everything the paper does with its notes.

    eng = load("smollm2-135m")
    notes = eng.prefill(document)                       # Notes (.token_ids, .cache)
    report = eng.edit(notes, fields=[Field(10, 16, "denied", "status")],
                      question=Question("Can this user log in?", ("yes", "no")))
    report = eng.compose(context, skills=[skill_text], question=Question(...))
    report = eng.run(document, fields, question, placements=[Placement(skill, at=120)])   # both at once

Every strategy is timed the same way, in this process, after a warm-up: from the cached old notes
(and compiled skills) to the decision. Recompute's time is a full prefill of the new text plus the
same readout. Attention maps are captured afterwards, outside the timings, with eager attention.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import torch

from app.errata import DEFAULT_TEMPLATE, render_erratum
from worker.engine.attention import capture_attention
from worker.engine.compare import fidelity
from worker.engine.compose import splice, token_boundary
from worker.engine.edit import Editor, Surgery, extend
from worker.engine.models import ModelInfo, load_model
from worker.engine.notes import Notes, cache_from_layers
from worker.engine.readout import Readout, decide, make_frame
from worker.engine.rope import NotPortableError, RopeLayout, rope_layout
from worker.engine.types import (
    STRATEGIES,
    Attention,
    EngineError,
    Field,
    ProgressFn,
    Question,
    Report,
    StrategyResult,
    TokenView,
)

log = logging.getLogger(__name__)

EDIT_STRATEGIES = STRATEGIES
AUTO_CANDIDATES = ("stale", "erratum", "in_place")  # cheaper than field_erratum, tried cheapest first


@dataclass
class Placement:
    """A skill to splice into the document before character `at` (None = at the end)."""

    text: str
    at: int | None = None
    notes: Notes | None = None  # the compiled skill; compiled on the fly when missing
    seam: int = 0


@dataclass
class _Outcome:
    surgery: Surgery
    readout: Readout
    latency_ms: float


class Engine:
    def __init__(self, model, tokenizer, info: ModelInfo, store=None):
        self.model, self.tokenizer, self.info = model, tokenizer, info
        self.frame = make_frame(tokenizer)
        self.store = store
        try:
            self.rope: RopeLayout | None = rope_layout(model)
            self.rope_error = ""
        except NotPortableError as exc:
            self.rope, self.rope_error = None, str(exc)
        self._warm = False

    @property
    def device(self) -> torch.device:
        return self.model.device

    # ---- tokens -------------------------------------------------------------------------------
    def tokenize_document(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[str]]:
        """Frame + document → ids, per-token char offsets into `text` ((-1,-1) in the frame), segments."""
        prefix = self.frame.prefix
        enc = self.tokenizer(prefix + text, add_special_tokens=self.frame.add_special_tokens,
                             return_offsets_mapping=True)
        ids, offsets, segments = list(enc["input_ids"]), [], []
        for start, end in enc["offset_mapping"]:
            if end <= len(prefix):  # the chat template's head, or a start token the tokenizer added
                offsets.append((-1, -1))
                segments.append("frame")
            else:
                offsets.append((max(start - len(prefix), 0), end - len(prefix)))
                segments.append("document")
        return ids, offsets, segments

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def start_token(self) -> int:
        """The model's start token, used as the attention sink a skill is compiled with."""
        tok = self.tokenizer
        if tok.bos_token_id is not None:
            return tok.bos_token_id
        if self.frame.prefix:
            return self.encode(self.frame.prefix)[0]
        return tok.eos_token_id

    # ---- prefill ------------------------------------------------------------------------------
    @property
    def model_key(self) -> str:
        """What the KV store keys this model's notes by (alias and dtype: bf16 notes are not fp32 notes)."""
        return f"{self.info.alias}:{self.model.dtype}"

    @torch.inference_mode()
    def _prefill_ids(self, ids: list[int]) -> list:
        """Full K/V of `ids`, reusing the longest prefix the KV store holds."""
        cached_n, cached = (0, None)
        if self.store is not None:
            cached_n, cached = self.store.get_prefix(self.model_key, ids)
        if cached_n and cached is not None:
            layers = [(k.unsqueeze(0).to(self.device), v.unsqueeze(0).to(self.device)) for k, v in cached]
            if cached_n < len(ids):
                layers = extend(self.model, layers, ids[cached_n:])
        else:
            layers = extend(self.model, None, ids)
        if self.store is not None and cached_n < len(ids):
            self.store.put(self.model_key, ids, [(k[0], v[0]) for k, v in layers])
        return layers

    def prefill(self, text: str) -> Notes:
        """Prefill the framed document and keep its notes: the FULL K/V of every layer."""
        ids, offsets, segments = self.tokenize_document(text)
        return Notes(ids, offsets, segments, self._prefill_ids(ids), text=text, rope=self.rope,
                     immobile_reason=self.rope_error)

    def compile_skill(self, text: str, sink: bool = True) -> Notes:
        """Prefill a skill once, after the start token (its attention sink, dropped when spliced).
        `sink=False` prefills the bare skill — worse, kept to measure exactly that."""
        if not text.strip():
            raise EngineError("a skill needs some text")
        body = self.encode(text)
        ids = ([self.start_token()] if sink else []) + body
        offsets = [(-1, -1)] * len(ids)
        segments = (["sink"] if sink else []) + ["skill"] * len(body)
        return Notes(ids, offsets, segments, self._prefill_ids(ids), text=text, rope=self.rope,
                     immobile_reason=self.rope_error)

    def require_portable(self) -> None:
        if self.rope is None:
            raise NotPortableError(f"{self.info.alias}: {self.rope_error}")

    def warm_up(self, n_tokens: int = 128) -> None:
        """One short and one longer forward before anything is timed (first calls of a shape are slow)."""
        if not self._warm:
            ids = (self.encode("warm up the kernels once. ") or [0]) * 64
            layers = extend(self.model, None, ids[: max(8, min(n_tokens, 256))])
            extend(self.model, layers, ids[:4])
            self._warm = True

    # ---- composing ----------------------------------------------------------------------------
    def compose_notes(self, context: Notes, placements: list[Placement]) -> tuple[Notes, str, int]:
        """Splice every placement into `context`. Returns the composed notes, the composed text
        (what recompute reads) and how many tokens seam repair ran through the model."""
        if not placements:
            return context, context.text, 0
        self.require_portable()
        snapped = [(token_boundary(context, p.at), i) for i, p in enumerate(placements)]
        order = sorted(snapped, key=lambda s: (s[0][0], s[1]))
        notes = context
        inserted = 0
        pieces, last_char, seam_tokens = [], 0, 0
        for (t, char), i in order:
            p = placements[i]
            skill = p.notes if p.notes is not None else self.compile_skill(p.text)
            notes = splice(self.model, notes, skill, t + inserted, seam=p.seam)
            body = skill.n_tokens - (1 if skill.segments[:1] == ["sink"] else 0)
            inserted += body
            seam_tokens += min(p.seam, body)
            pieces += [context.text[last_char:char], p.text]
            last_char = char
        pieces.append(context.text[last_char:])
        return notes, "".join(pieces), seam_tokens

    # ---- the report ---------------------------------------------------------------------------
    def _timed(self, fn, suffix_ids: list[int], question: Question, extra_ms: float = 0.0) -> _Outcome:
        t0 = time.perf_counter()
        surgery = fn()
        readout = decide(self.model, self.tokenizer, self.frame, cache_from_layers(surgery.layers), suffix_ids,
                         question, pending=surgery.pending)
        ms = (time.perf_counter() - t0) * 1000 + extra_ms
        return _Outcome(surgery, readout, ms)

    def _result(self, out: _Outcome, ref: _Outcome, detail: str = "") -> StrategyResult:
        f = fidelity(ref.readout.logits, out.readout.logits)
        return StrategyResult(
            decision=out.readout.decision, choice_probs=out.readout.choice_probs,
            kl_to_recompute=f.kl_to_recompute, top1_agrees=f.top1_agrees, topk_overlap=f.topk_overlap,
            logit_cosine=f.logit_cosine,
            decision_matches_recompute=_same_decision(out.readout.decision, ref.readout.decision),
            tokens_computed=out.surgery.tokens_computed, latency_ms=round(out.latency_ms, 3),
            text=out.readout.text, detail=detail or out.surgery.detail,
        )

    def _attention(self, out: _Outcome, suffix_ids: list[int]) -> Attention:
        s = out.surgery
        weights = capture_attention(self.model, s.layers, s.pending + suffix_ids)
        views = [
            TokenView(id=tid, text=self.tokenizer.decode([tid]), start=o[0], end=o[1], segment=seg)
            for tid, o, seg in zip(s.token_ids, s.offsets, s.segments)
        ]
        views += [TokenView(id=t, text=self.tokenizer.decode([t]), start=-1, end=-1, segment="question") for t in suffix_ids]
        return Attention(weights=weights, tokens=views)

    def run(
        self,
        document: str,
        fields: list[Field] = (),
        question: Question | str | None = None,
        strategies: list[str] | tuple[str, ...] = EDIT_STRATEGIES,
        errata: list[str] | None = None,
        placements: list[Placement] = (),
        erratum_template: str = DEFAULT_TEMPLATE,
        selective_fraction: float = 0.15,
        attention: bool | list[str] = False,
        progress: ProgressFn | None = None,
        old_notes: Notes | None = None,
        choices: tuple[str, ...] | list[str] = (),
        cot: bool = False,
    ) -> Report:
        """Edit `fields` of `document` (with `placements` spliced in) by every strategy asked, and
        compare each against recompute on `question` (a `Question`, or its text with `choices`/`cot`)."""
        if isinstance(question, str):
            question = Question(question, tuple(choices), cot)
        if question is None or not question.text.strip():
            raise EngineError("a question is needed: the decision is read after it")
        report_progress = progress or (lambda stage, frac: None)
        strategies = _checked_strategies(strategies)
        fields = _checked_fields(document, fields)
        report_progress("prefill", 0.02)
        old = old_notes if old_notes is not None else self.prefill(document)
        self.warm_up()

        t0 = time.perf_counter()
        base, composed_text, seam_tokens = self.compose_notes(old, list(placements))
        splice_ms = (time.perf_counter() - t0) * 1000
        to_composed, from_composed = _char_maps(document, composed_text, placements, old)
        new_text = _apply_fields(composed_text, [_move_field(f, to_composed) for f in fields])
        new_ids, new_offsets_c, new_segments = self.tokenize_document(new_text)
        new_offsets = [_map_new_offset(o, new_text, composed_text, fields, to_composed, from_composed) for o in new_offsets_c]
        if errata is None:
            errata = [render_erratum(f.label, document[f.start:f.end], f.new_value, erratum_template) for f in fields]
        erratum_ids = self.encode("".join(errata)) if errata else []
        suffix_ids = self.encode(self.frame.suffix(question))
        editor = Editor(self.model, self.rope, base, new_ids, new_segments, new_offsets)
        base_ms = splice_ms if placements else 0.0

        plans = {
            "recompute": (editor.recompute, 0.0),
            "prefix_reuse": (editor.prefix_reuse, base_ms),
            "stale": (editor.stale, base_ms),
            "in_place": (editor.in_place, base_ms),
            "erratum": (lambda: editor.erratum(erratum_ids), base_ms),
            "field_erratum": (lambda: editor.field_erratum(erratum_ids), base_ms),
            "selective": (lambda: editor.selective(selective_fraction), base_ms),
        }
        if any(s in ("in_place", "field_erratum", "selective", "auto") for s in strategies) and \
                len(new_ids) != len(base.token_ids):
            self.require_portable()
        outcomes: dict[str, _Outcome] = {}
        order = ["recompute"] + [s for s in strategies if s != "recompute"]
        needed = list(dict.fromkeys(order + (["field_erratum", *AUTO_CANDIDATES] if "auto" in order else [])))
        needed = [s for s in needed if s != "auto"]
        for i, name in enumerate(needed):
            report_progress(f"edit: {name}", 0.05 + 0.6 * i / len(needed))
            fn, extra = plans[name]
            outcomes[name] = self._timed(fn, suffix_ids, question, extra)
            if name != "recompute":  # every strategy starts from the composed notes: seam repair is its cost too
                outcomes[name].surgery.tokens_computed += seam_tokens

        report_progress("compare", 0.7)
        ref = outcomes["recompute"]
        report = Report(model=self.info.alias, document_tokens=len(old.token_ids))
        for name in order:
            if name == "auto":
                report.strategies["auto"] = self._auto(outcomes, ref)
            else:
                report.strategies[name] = self._result(outcomes[name], ref)

        wanted = order if attention is True else [s for s in (attention or []) if s in order]
        for i, name in enumerate(wanted):
            report_progress(f"attention: {name}", 0.75 + 0.24 * i / max(len(wanted), 1))
            src = outcomes[_auto_pick(report) if name == "auto" else name]
            report.attention[name] = self._attention(src, suffix_ids)
        report_progress("done", 1.0)
        return report

    def _auto(self, outcomes: dict[str, _Outcome], ref: _Outcome) -> StrategyResult:
        """The cheapest strategy whose decision matches field_erratum's (the robust default).
        Its latency is every probe it had to run, honestly summed."""
        target = outcomes["field_erratum"].readout.decision
        spent = 0.0
        for name in sorted(AUTO_CANDIDATES, key=lambda n: outcomes[n].surgery.tokens_computed):
            spent += outcomes[name].latency_ms
            if _same_decision(outcomes[name].readout.decision, target):
                picked = name
                break
        else:
            picked = "field_erratum"
        spent += outcomes["field_erratum"].latency_ms
        o = outcomes[picked]
        chosen = _Outcome(o.surgery, o.readout, spent)
        return self._result(chosen, ref, detail=f"picked {picked}")

    # ---- the paper's two operations, one at a time --------------------------------------------
    def edit(self, notes: Notes | str, fields: list[Field], question: Question | str, **kw) -> Report:
        """Edit fields of a document whose notes are cached (or of a text, prefilled first)."""
        if isinstance(notes, str):
            return self.run(notes, fields, question, **kw)
        return self.run(notes.text, fields, question, old_notes=notes, **kw)

    def compose(self, context: Notes | str, skills: list[str | Notes], question: Question | str,
                at: int | None | list[int | None] = None, seam: int = 0, attention: bool = False,
                progress: ProgressFn | None = None) -> Report:
        """Splice compiled skills into a context; report `splice` against `recompute`."""
        self.require_portable()
        if isinstance(question, str):
            question = Question(question)
        ats = at if isinstance(at, list) else [at] * len(skills)
        if len(ats) != len(skills):
            raise EngineError(f"{len(skills)} skills but {len(ats)} positions")
        placements = [
            Placement(text=s.text if isinstance(s, Notes) else s, at=a,
                      notes=s if isinstance(s, Notes) else self.compile_skill(s), seam=seam)
            for s, a in zip(skills, ats)
        ]
        old = self.prefill(context) if isinstance(context, str) else context
        report = self.run(old.text, [], question, strategies=["recompute", "stale"], placements=placements,
                          attention=["recompute", "stale"] if attention else False, progress=progress,
                          old_notes=old)
        report.strategies["splice"] = report.strategies.pop("stale")
        if "stale" in report.attention:
            report.attention["splice"] = report.attention.pop("stale")
        return report


def _same_decision(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _auto_pick(report: Report) -> str:
    return report.strategies["auto"].detail.removeprefix("picked ")


def _checked_strategies(strategies) -> list[str]:
    unknown = [s for s in strategies if s not in EDIT_STRATEGIES]
    if unknown:
        raise EngineError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(EDIT_STRATEGIES)}")
    return list(dict.fromkeys(["recompute", *strategies]))


def _checked_fields(document: str, fields) -> list[Field]:
    fields = sorted(fields, key=lambda f: f.start)
    for f in fields:
        if not (0 <= f.start < f.end <= len(document)):
            raise EngineError(f"field {f.label or ''} [{f.start}, {f.end}) is not inside the document (0..{len(document)})")
    for a, b in zip(fields, fields[1:]):
        if b.start < a.end:
            raise EngineError(f"fields [{a.start}, {a.end}) and [{b.start}, {b.end}) overlap")
    return fields


def _char_maps(document: str, composed: str, placements, old: Notes):
    """Maps between document offsets and composed-text offsets (skills inserted)."""
    inserts = []  # (doc char, length)
    for p in placements:
        _, char = token_boundary(old, p.at)
        inserts.append((char, len(p.text)))
    inserts.sort()

    def to_composed(c: int, is_end: bool = False) -> int:
        """A skill inserted at char `at` goes before that char: it moves a field starting there,
        not a field ending there."""
        return c + sum(n for at, n in inserts if (at < c if is_end else at <= c))

    def from_composed(c: int) -> int:
        shift = 0
        for at, n in inserts:
            if c < at + shift:
                break
            if c < at + shift + n:
                return -1  # inside a skill
            shift += n
        return c - shift

    return to_composed, from_composed


def _move_field(f: Field, to_composed) -> Field:
    return Field(to_composed(f.start), to_composed(f.end, is_end=True), f.new_value, f.label)


def _apply_fields(text: str, fields: list[Field]) -> str:
    for f in sorted(fields, key=lambda f: f.start, reverse=True):
        text = text[: f.start] + f.new_value + text[f.end:]
    return text


def _map_new_offset(o, new_text, composed_text, fields, to_composed, from_composed):
    """A char offset in the new composed text → the matching offset in the OLD document, so every
    strategy's tokens can be drawn over the same document. Text inside a new value maps to its field."""
    if o == (-1, -1):
        return o
    start = o[0]
    delta = 0
    for f in sorted(fields, key=lambda f: f.start):
        cs, ce = to_composed(f.start), to_composed(f.end, is_end=True)
        new_s, new_e = cs + delta, cs + delta + len(f.new_value)
        if start < new_s:
            break
        if start < new_e:
            return (f.start, f.end)
        delta += len(f.new_value) - (ce - cs)
    d = from_composed(start - delta)
    if d < 0:
        return (-1, -1)
    return (d, d + (o[1] - o[0]))


_ENGINES: dict[tuple[str, str], Engine] = {}


def load(name: str | None = None, device: str | None = None, store=None, trust_remote_code: bool = False) -> Engine:
    """An Engine for a model alias, local path or hub id; cached per process and device.
    `device`: "cpu", "cuda", ... (default: CUDA when available, in bf16 there)."""
    from worker.engine.models import DEFAULT_MODEL

    name = name or DEFAULT_MODEL
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    key = (name, device)
    if key not in _ENGINES:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model, tokenizer, info = load_model(name, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        _ENGINES[key] = Engine(model, tokenizer, info)
    engine = _ENGINES[key]
    if store is not None:
        engine.store = store
    return engine


@contextlib.contextmanager
def no_store(engine: Engine):
    saved, engine.store = engine.store, None
    try:
        yield engine
    finally:
        engine.store = saved
