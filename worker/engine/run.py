"""One run: every strategy of a `RunRequest`, timed the same way and compared against recompute.

The strategies are objects from the registry (`worker.engine.strategies.EDITS`); the one measure
loop (`worker.engine.strategies.measure`) times each in this process after a warm-up, from the cached
old notes (and compiled skills) to the decision, times the fast ones again, interleaved, and scores
them. Recompute's time is a full prefill of the new text plus the same readout. A strategy that
starts from spliced notes pays for the splice and its seam repair too. Attention maps are captured
afterwards, outside the timings, with eager attention.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vocabulary import (
    DEFAULT_TEMPLATE,
    FLOOR,
    REFERENCE,
    STRATEGIES,
    render_erratum,
    unknown_strategies,
    with_recompute,
)
from vocabulary.verdicts import edit_followed
from worker.engine.attention import attention_of
from worker.engine.attribution import notes_map
from worker.engine.compare import fidelity
from worker.engine.compose import Placement, token_boundary
from worker.engine.devices import describe_device, dtype_name
from worker.engine.edit import Editor, Surgery
from worker.engine.mechanism import explain
from worker.engine.notes import Notes, cache_from_layers
from worker.engine.offsets import Insertions, apply_fields, new_to_document
from worker.engine.readout import decide
from worker.engine.strategies import EDITS
from worker.engine.strategies.edit import EditCase, complete_notes
from worker.engine.strategies.measure import Bench, Outcome, measure, result_of, score
from worker.engine.types import (
    Attribution,
    EngineError,
    Field,
    ProgressFn,
    Question,
    Report,
)

if TYPE_CHECKING:
    from worker.engine.loaded import LoadedModel


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
    mechanism: bool = False  # also knockout, selective@K and the logit lens (`worker.engine.mechanism`)
    policy: str | None = None  # the strategy the notebook adopted from a sweep: `auto` applies it
    # False: decisions only (a sweep's edit past its timed sample): every strategy once, untimed, the
    # reference computed exactly from the field on (`worker.engine.strategies.measure`)
    timing: bool = True
    # in a timed run: also compute the reference the decision-only way and give its KL to the true
    # recompute (`Report.exact_reference_kl`): a sweep checks its shortcut on its timed sample
    check_reference: bool = False


def run(engine: LoadedModel, request: RunRequest, notes: Notes | None = None,
        progress: ProgressFn | None = None) -> Report:
    """The report of `request`; `notes` are the document's cached notes (prefilled when None)."""
    report_progress = progress or (lambda stage, fraction: None)
    strategies = EDITS.build(_checked(request))
    values = tuple([request.document[f.start:f.end] for f in request.fields]
                   + [f.new_value for f in request.fields])
    for strategy in strategies.values():
        strategy.follow(request.policy)
        strategy.judge_by(values, tuple(request.question.choices))
    report_progress("prefill", 0.02)
    old = notes if notes is not None else engine.prefill(request.document)
    reuse = engine.last_reuse if notes is None else None
    engine.warm_up()
    case, bench = _plan(engine, request, old, report_progress)
    runners = EDITS.runners(strategies)
    editor = case.editor
    length_changes = len(editor.new_ids) != len(editor.old.token_ids)
    if length_changes and any(s.info.moves_keys for s in strategies.values()):
        engine.require_portable()

    outcomes = measure(bench, case, runners, timing=request.timing)
    report_progress("compare", 0.7)
    score(bench, case, runners, outcomes, REFERENCE)
    ref = outcomes[REFERENCE]
    followed = _followed(request)
    chosen = {name: s.outcome(outcomes) for name, s in strategies.items()}
    report = Report(model=engine.info.alias, document_tokens=len(old.token_ids),
                    dtype=dtype_name(engine.model.dtype), device=describe_device(engine.model),
                    timed=request.timing, store_reuse=reuse)
    if request.timing and request.check_reference:
        report.exact_reference_kl = _exact_reference_kl(engine, editor, bench, ref)
    for name, out in chosen.items():
        report.strategies[name] = result_of(out, ref, followed)
        if not request.timing and out.readout.orders_read:
            report.orders_read[name] = out.readout.orders_read
        if out.read_from is not None:
            report.read_from[name] = out.read_from

    if request.attribution:
        report_progress("notes map", 0.72)
        report.attribution = _notes_map(engine, editor, outcomes, bench.suffix_ids)
    if request.mechanism:
        report.mechanism = explain(engine, editor, chosen, report.strategies, bench.suffix_ids,
                                   request.question, [(f.start, f.end) for f in request.fields],
                                   report.attribution,
                                   progress=lambda stage, f: report_progress(stage, 0.73 + 0.02 * f),
                                   values=values)
    wanted = list(strategies) if request.attention is True else \
        [s for s in (request.attention or ()) if s in strategies]
    for i, name in enumerate(wanted):
        report_progress(f"attention: {name}", 0.75 + 0.24 * i / max(len(wanted), 1))
        out = chosen[name]
        report.attention[name] = attention_of(engine.model, engine.tokenizer, out.surgery,
                                              out.readout.answer_ids, bench.suffix_ids)
    report_progress("done", 1.0)
    return report


def _exact_reference_kl(engine: LoadedModel, editor: Editor, bench: Bench, ref: Outcome) -> float:
    """KL of the first answer token after the reference computed exactly from the first change on
    (what a decision-only run uses) from the true recompute's `ref`: 0 up to float rounding."""
    exact = editor.from_first_change()
    readout = decide(engine.model, engine.tokenizer, engine.frame,
                     cache_from_layers(exact.layers, engine.model), bench.suffix_ids, bench.question,
                     first_token_only=True)
    return max(fidelity(ref.readout.logits, readout.logits).kl_to_recompute, 0.0)


def _followed(request: RunRequest) -> Callable[[str], str | None]:
    """An answer's `edit_followed` verdict for this request's fields (None without fields)."""
    if not request.fields:
        return lambda answer: None
    old = [request.document[f.start:f.end] for f in request.fields]
    new = [f.new_value for f in request.fields]
    return lambda answer: edit_followed(answer, old, new, request.question.choices)


def _checked(request: RunRequest) -> list[str]:
    """The strategies to report (recompute first), after checking the question and the fields."""
    if not request.question.text.strip():
        raise EngineError("a question is needed: the decision is read after it")
    problem = unknown_strategies(request.strategies)
    if problem:
        raise EngineError(problem)
    if request.policy is not None and (request.policy not in EDITS.names
                                       or EDITS.classes[request.policy].info.parts):
        raise EngineError(f"the adopted policy {request.policy!r} is not a strategy with notes of its own "
                          f"(one of {', '.join(n for n in EDITS.names if not EDITS.classes[n].info.parts)})")
    fields = sorted(request.fields, key=lambda f: f.start)
    n = len(request.document)
    for f in fields:
        if not (0 <= f.start < f.end <= n):
            raise EngineError(f"field {f.label or ''} [{f.start}, {f.end}) is not inside the document "
                              f"(0..{n})")
    for a, b in zip(fields, fields[1:]):
        if b.start < a.end:
            raise EngineError(f"fields [{a.start}, {a.end}) and [{b.start}, {b.end}) overlap")
    return with_recompute(request.strategies)


def _plan(engine: LoadedModel, request: RunRequest, old: Notes,
          progress: ProgressFn) -> tuple[EditCase, Bench]:
    """Splice the placements into the old notes, apply the fields to the composed text, and tokenize
    what every strategy reads; new tokens carry offsets into the OLD document."""
    fields = sorted(request.fields, key=lambda f: f.start)
    t0 = time.perf_counter()
    base, composed_text, seam_tokens = engine.compose_notes(old, list(request.placements))
    splice_ms = (time.perf_counter() - t0) * 1000
    inserts = Insertions.of([(token_boundary(old, p.at)[1], len(p.text)) for p in request.placements])
    moved = [inserts.move(f) for f in fields]
    new_ids, new_offsets, new_segments = engine.tokenize_document(apply_fields(composed_text, moved))
    new_offsets = [new_to_document(o, fields, inserts) for o in new_offsets]
    errata = request.errata
    if errata is None:
        errata = tuple(render_erratum(f.label, request.document[f.start:f.end], f.new_value,
                                      request.erratum_template) for f in fields)
    case = EditCase(
        engine=engine,
        editor=Editor(engine.model, engine.rope, base, new_ids, new_segments, new_offsets),
        erratum_ids=engine.encode("".join(errata)) if errata else [],
        cached_ids=list(base.token_ids),  # the original prompt's notes, placed skills included
        composed_text=composed_text, fields=moved, inserts=inserts,
        selective_fraction=request.selective_fraction,
    )
    suffix_ids = engine.encode(engine.frame.suffix(request.question))
    # the cached notes' own readout, kept with them for the next decision-only run (a sweep's edit)
    kept = (old.layers, old.derived.setdefault(("readout", request.question, tuple(suffix_ids)), {})) \
        if base is old else None
    bench = Bench(engine, request.question, suffix_ids,
                  overhead_ms=splice_ms if request.placements else 0.0, overhead_tokens=seam_tokens,
                  progress=progress, kept=kept)
    return case, bench


def _notes_map(engine: LoadedModel, editor: Editor, outcomes: dict[str, Outcome],
               suffix_ids: list[int]) -> Attribution:
    """The notes map from the run's own reference notes, and the field-alone ones
    (`Registry.field_alone`) and the floor's (made here when the run did not measure them)."""
    if len(editor.new_ids) != len(editor.old.token_ids):
        engine.require_portable()
    moved, old = (_measured(outcomes, name) or complete_notes(EDITS.build([name])[name], editor)
                  for name in (EDITS.field_alone(), FLOOR))
    return notes_map(engine.model, engine.tokenizer, editor, outcomes[REFERENCE].surgery.layers,
                     moved.layers, old.layers, suffix_ids)


def _measured(outcomes: dict[str, Outcome], name: str) -> Surgery | None:
    """The notes strategy `name` made in this run, if it ran."""
    out = outcomes.get(name)
    return out.surgery if out is not None else None
