"""One run: every strategy of a `RunRequest`, timed the same way and compared against recompute.

Every strategy is timed in this process, after a warm-up: from the cached old notes (and compiled
skills) to the decision. Recompute's time is a full prefill of the new text plus the same readout.
A strategy that starts from spliced notes pays for the splice and its seam repair too. Attention
maps are captured afterwards, outside the timings, with eager attention.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vocabulary import (
    AUTO_CANDIDATES,
    DEFAULT_TEMPLATE,
    STRATEGIES,
    render_erratum,
    unknown_strategies,
    with_recompute,
)
from worker.engine.attention import capture_attention
from worker.engine.attribution import notes_map
from worker.engine.compare import fidelity, same_answer, token_f1
from worker.engine.compose import Placement, token_boundary
from worker.engine.edit import Editor, Surgery, common_prefix
from worker.engine.notes import Notes, cache_from_layers
from worker.engine.offsets import Insertions, apply_fields, new_to_document
from worker.engine.readout import Frame, Readout, answer_nll, decide
from worker.engine.rope import RopeLayout
from worker.engine.types import (
    Attention,
    Attribution,
    EngineError,
    Field,
    ProgressFn,
    Question,
    Report,
    StrategyResult,
    TokenView,
)


class Engine(Protocol):
    """What a run needs of `worker.engine.engine.Engine` (named here so the two modules do not
    import each other)."""

    model: Any  # a transformers causal LM
    tokenizer: Any
    frame: Frame
    rope: RopeLayout | None
    info: Any  # ModelInfo: .alias names the model in the report

    def prefill(self, text: str) -> Notes: ...
    def warm_up(self) -> None: ...
    def require_portable(self) -> None: ...
    def encode(self, text: str) -> list[int]: ...
    def tokenize_document(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[str]]: ...
    def compose_notes(self, context: Notes, placements: list[Placement]) -> tuple[Notes, str, int]: ...

@dataclass(frozen=True)
class RunRequest:
    """Everything `Engine.run` does in one typed value: edit `fields` of `document` (with
    `placements` spliced in) by every strategy asked, and compare each against recompute on
    `question`.

    errata: the texts appended by `erratum` / `field_erratum`; None renders one per field from
        `erratum_template`.
    attention: capture the decision's attention for every strategy (True) or for those named.
    attribution: patch spans of notes from recompute into the in_place cache to find which carry
        the decision (costs about one recompute per 500 document tokens, on top of the strategies).
    """

    document: str
    question: Question
    fields: tuple[Field, ...] = ()
    strategies: tuple[str, ...] = STRATEGIES
    errata: tuple[str, ...] | None = None
    placements: tuple[Placement, ...] = ()
    erratum_template: str = DEFAULT_TEMPLATE
    selective_fraction: float = 0.15
    attention: bool | tuple[str, ...] = False
    attribution: bool = False  # also map which notes carry the decision (`worker.engine.attribution`)


# Strategies that move downstream keys when the field's length changes: they need a portable RoPE.
_MOVES_KEYS = ("in_place", "field_erratum", "selective", "auto")


@dataclass
class Outcome:
    """One strategy's notes after surgery, its readout, what it cost (to the first answer token and
    to the whole answer), and, once every strategy ran, how it scores recompute's answer."""

    surgery: Surgery
    readout: Readout
    latency_ms: float
    ttft_ms: float
    answer_nll: float | None = None  # of recompute's answer under these notes
    prefix_cache_share: float = 0.0


@dataclass
class _Plan:
    """What every strategy needs: the composed old notes, the editor holding the new text's tokens,
    the erratum and question tokens, and what composing cost."""

    editor: Editor
    erratum_ids: list[int]
    suffix_ids: list[int]
    splice_ms: float
    seam_tokens: int
    cached_ids: list[int]  # the old document's tokens: what a serving engine's prefix cache holds


def run(engine: Engine, request: RunRequest, notes: Notes | None = None,
        progress: ProgressFn | None = None) -> Report:
    """The report of `request`; `notes` are the document's cached notes (prefilled when None)."""
    report_progress = progress or (lambda stage, fraction: None)
    strategies = _checked(request)
    report_progress("prefill", 0.02)
    old = notes if notes is not None else engine.prefill(request.document)
    engine.warm_up()
    plan = _plan(engine, request, old)
    if any(s in _MOVES_KEYS for s in strategies) and len(plan.editor.new_ids) != len(plan.editor.old.token_ids):
        engine.require_portable()

    outcomes = _measure(engine, request, plan, strategies, report_progress)
    report_progress("compare", 0.7)
    ref = outcomes["recompute"]
    _score_answers(engine, plan, outcomes)
    report = Report(model=engine.info.alias, document_tokens=len(plan.cached_ids))
    for name in strategies:
        report.strategies[name] = _auto(outcomes, ref) if name == "auto" else result_of(outcomes[name], ref)

    if request.attribution:
        report_progress("notes map", 0.72)
        report.attribution = _notes_map(engine, plan, outcomes)
    wanted = strategies if request.attention is True else [s for s in (request.attention or ()) if s in strategies]
    for i, name in enumerate(wanted):
        report_progress(f"attention: {name}", 0.75 + 0.24 * i / max(len(wanted), 1))
        picked = report.strategies["auto"].detail.removeprefix("picked ") if name == "auto" else name
        report.attention[name] = _attention(engine, outcomes[picked], plan.suffix_ids)
    report_progress("done", 1.0)
    return report


def _checked(request: RunRequest) -> list[str]:
    """The strategies to report (recompute first), after checking the question and the fields."""
    if not request.question.text.strip():
        raise EngineError("a question is needed: the decision is read after it")
    problem = unknown_strategies(request.strategies)
    if problem:
        raise EngineError(problem)
    fields = sorted(request.fields, key=lambda f: f.start)
    n = len(request.document)
    for f in fields:
        if not (0 <= f.start < f.end <= n):
            raise EngineError(f"field {f.label or ''} [{f.start}, {f.end}) is not inside the document (0..{n})")
    for a, b in zip(fields, fields[1:]):
        if b.start < a.end:
            raise EngineError(f"fields [{a.start}, {a.end}) and [{b.start}, {b.end}) overlap")
    return with_recompute(request.strategies)


def _plan(engine: Engine, request: RunRequest, old: Notes) -> _Plan:
    """Splice the placements into the old notes, apply the fields to the composed text, and tokenize
    what every strategy reads; new tokens carry offsets into the OLD document."""
    fields = sorted(request.fields, key=lambda f: f.start)
    t0 = time.perf_counter()
    base, composed_text, seam_tokens = engine.compose_notes(old, list(request.placements))
    splice_ms = (time.perf_counter() - t0) * 1000
    inserts = Insertions.of([(token_boundary(old, p.at)[1], len(p.text)) for p in request.placements])
    new_text = apply_fields(composed_text, [inserts.move(f) for f in fields])
    new_ids, new_offsets, new_segments = engine.tokenize_document(new_text)
    new_offsets = [new_to_document(o, fields, inserts) for o in new_offsets]
    errata = request.errata
    if errata is None:
        errata = tuple(render_erratum(f.label, request.document[f.start:f.end], f.new_value, request.erratum_template)
                       for f in fields)
    return _Plan(
        editor=Editor(engine.model, engine.rope, base, new_ids, new_segments, new_offsets),
        erratum_ids=engine.encode("".join(errata)) if errata else [],
        suffix_ids=engine.encode(engine.frame.suffix(request.question)),
        splice_ms=splice_ms if request.placements else 0.0,
        seam_tokens=seam_tokens,
        cached_ids=list(old.token_ids),
    )


def _measure(engine: Engine, request: RunRequest, plan: _Plan, strategies: list[str],
             report_progress: ProgressFn) -> dict[str, Outcome]:
    """Run each strategy needed (auto needs field_erratum and its candidates) and time it."""
    editor, erratum_ids = plan.editor, plan.erratum_ids
    surgeries: dict[str, Callable[[], Surgery]] = {
        "recompute": editor.recompute,
        "prefix_reuse": editor.prefix_reuse,
        "stale": editor.stale,
        "in_place": lambda: editor.in_place(defer=True),
        "erratum": lambda: editor.erratum(erratum_ids),
        "field_erratum": lambda: editor.field_erratum(erratum_ids, defer=True),
        "selective": lambda: editor.selective(request.selective_fraction, defer=True),
    }
    needed = strategies + (["field_erratum", *AUTO_CANDIDATES] if "auto" in strategies else [])
    needed = [s for s in dict.fromkeys(needed) if s != "auto"]
    outcomes: dict[str, Outcome] = {}
    for i, name in enumerate(needed):
        report_progress(f"edit: {name}", 0.05 + 0.6 * i / len(needed))
        t0 = time.perf_counter()
        surgery = surgeries[name]()
        readout = decide(engine.model, engine.tokenizer, engine.frame, cache_from_layers(surgery.layers, engine.model),
                         plan.suffix_ids, request.question, pending=surgery.pending, deferred=surgery.deferred)
        surgery = surgery.completed(readout.deferred_kv)  # writes the deferred K/V into the strategy's notes
        ms, ttft = (time.perf_counter() - t0) * 1000, (readout.first_token_at - t0) * 1000
        if name != "recompute":  # every other strategy starts from the composed notes: the splice is its cost too
            ms, ttft = ms + plan.splice_ms, ttft + plan.splice_ms
            surgery.tokens_computed += plan.seam_tokens
        outcomes[name] = Outcome(surgery, readout, ms, ttft)
    return outcomes


def _score_answers(engine: Engine, plan: _Plan, outcomes: dict[str, Outcome]) -> None:
    """Outside the timings: how likely each strategy's notes find recompute's answer (teacher-forced
    NLL), and how much of its final prompt an exact-prefix serving cache of the old one would reuse."""
    reference = outcomes["recompute"].readout.answer_ids
    for out in outcomes.values():
        s = out.surgery
        prompt = list(s.pending) + plan.suffix_ids
        out.answer_nll = answer_nll(engine.model, s.layers, prompt, reference)
        final = list(s.token_ids) + plan.suffix_ids  # token_ids already end with the pending ones
        out.prefix_cache_share = common_prefix(plan.cached_ids, final) / len(final)


def _notes_map(engine: Engine, plan: _Plan, outcomes: dict[str, Outcome]) -> Attribution:
    """The notes map from the run's own recompute notes, and its in_place and stale ones."""
    editor = plan.editor
    if len(editor.new_ids) != len(editor.old.token_ids):
        engine.require_portable()
    in_place = outcomes["in_place"].surgery if "in_place" in outcomes else editor.in_place()
    stale = outcomes["stale"].surgery if "stale" in outcomes else editor.stale()
    return notes_map(engine.model, engine.tokenizer, editor, outcomes["recompute"].surgery.layers,
                     in_place.layers, stale.layers, plan.suffix_ids)


def result_of(out: Outcome, ref: Outcome, detail: str = "") -> StrategyResult:
    """A strategy's metrics against recompute's outcome `ref`."""
    f = fidelity(ref.readout.logits, out.readout.logits)
    return StrategyResult(
        decision=out.readout.decision,
        choice_probs=out.readout.choice_probs,
        kl_to_recompute=f.kl_to_recompute,
        top1_agrees=f.top1_agrees,
        topk_overlap=f.topk_overlap,
        logit_cosine=f.logit_cosine,
        decision_matches_recompute=same_answer(out.readout.decision, ref.readout.decision),
        tokens_computed=out.surgery.tokens_computed,
        latency_ms=round(out.latency_ms, 3),
        ttft_ms=round(out.ttft_ms, 3),
        decode_ms=round(max(out.latency_ms - out.ttft_ms, 0.0), 3),
        answer_f1=round(token_f1(out.readout.decision, ref.readout.decision), 4),
        recompute_answer_nll=None if out.answer_nll is None else round(out.answer_nll, 5),
        prefix_cache_share=round(out.prefix_cache_share, 4),
        text=out.readout.text,
        detail=detail or out.surgery.detail,
    )


def _auto(outcomes: dict[str, Outcome], ref: Outcome) -> StrategyResult:
    """The cheapest candidate whose decision matches field_erratum's (the robust default). Its
    latency is every probe it had to run, honestly summed."""
    target = outcomes["field_erratum"].readout.decision
    spent = 0.0
    for name in sorted(AUTO_CANDIDATES, key=lambda n: outcomes[n].surgery.tokens_computed):
        spent += outcomes[name].latency_ms
        if same_answer(outcomes[name].readout.decision, target):
            picked = name
            break
    else:
        picked = "field_erratum"
    spent += outcomes["field_erratum"].latency_ms
    chosen = outcomes[picked]
    decode = chosen.latency_ms - chosen.ttft_ms  # the probes before it all count towards its first token
    cost = Outcome(chosen.surgery, chosen.readout, spent, spent - decode, chosen.answer_nll, chosen.prefix_cache_share)
    return result_of(cost, ref, detail=f"picked {picked}")


def _attention(engine: Engine, out: Outcome, suffix_ids: list[int]) -> Attention:
    """Where the decision looked over every token of the strategy's notes, and where each question
    and answer token looked, with the tokens themselves."""
    s = out.surgery
    answer = list(out.readout.answer_ids)
    fed = list(s.pending) + list(suffix_ids) + answer
    decision = len(s.pending) + len(suffix_ids) - 1
    weights, per_query = capture_attention(engine.model, s.layers, fed, decision)
    decode = engine.tokenizer.decode
    views = [
        TokenView(id=tid, text=decode([tid]), start=o[0], end=o[1], segment=seg)
        for tid, o, seg in zip(s.token_ids, s.offsets, s.segments)
    ]
    views += [TokenView(id=t, text=decode([t]), start=-1, end=-1, segment="question") for t in suffix_ids]
    views += [TokenView(id=t, text=decode([t]), start=-1, end=-1, segment="answer") for t in answer]
    cached = len(s.token_ids) - len(s.pending)
    return Attention(weights=weights, tokens=views, query_weights=per_query[len(s.pending):],
                     query_start=len(s.token_ids), decision=cached + decision)
