"""Trajectories: a document and ordered turns, each strategy carrying its OWN cache forward.

A turn may append text (a tool result, a message), change fields (label -> value) and ask a question
(the trajectory's question when it asks none). At every turn, for every strategy:

1. what the turn appends is prefilled onto the strategy's cache, as an agent's server does;
2. the field changes are applied by the strategy itself: its own `surgery` (its file under
   `strategies/edits/`) on an `EditCase` whose old notes are the strategy's cache as it stands
   (document, appended turns, errata) and whose new tokens are that cache with the document's values
   changed; an erratum it appends lands after the last turn's text. With the `one_per_field`
   variant the field's earlier erratum is first cut from the cache (later keys re-rotated);
3. the decision is read after the cache with the readout's `decide` (choices over their cyclic
   orders, as a run reads them) and compared with recompute's (`compare.fidelity`).

Exact strategies (recompute, prefix_reuse: `info.exact`) hold the whole current prompt, tokenized
as one text each turn: recompute prefills it all again, prefix_reuse keeps the notes up to the first
token that differs. Nothing is deferred to the readout here (`_Eager`): a cache carried forward must
be complete before the next turn. `tokens_computed` counts the tokens a strategy ran through the
model for its cache at that turn (the question's tokens, the same for all, are not counted);
`ttft_ms` is from the turn's start to the decision's first token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vocabulary import DEFAULT_TEMPLATE, REFERENCE, render_erratum
from vocabulary.regions import ERRATUM
from vocabulary.trajectories import (
    StrategyTurn,
    Summary,
    TrajectorySpec,
    TurnRecord,
    carried,
    split_variant,
    summaries,
    unknown_keys,
    verdict,
    with_reference,
)
from vocabulary.verdicts import edit_followed
from worker.engine.compare import fidelity, same_answer
from worker.engine.edit import Editor, shift
from worker.engine.forward import cut, extend, join_all
from worker.engine.loaded import LoadedModel
from worker.engine.notes import KV, Notes, cache_from_layers
from worker.engine.readout import decide, orders_suffixes
from worker.engine.strategies import EDITS, Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.types import EngineError, Field, Question

APPENDED = "turn"  # the segment of a turn's appended tokens


@dataclass(frozen=True)
class Turn:
    """One turn: text appended, fields changed ((label, value) pairs), a question (None: the
    trajectory's)."""

    append: str = ""
    fields: tuple[tuple[str, str], ...] = ()
    question: Question | None = None


@dataclass(frozen=True)
class TrajectoryRequest:
    """A document with labelled fields (their spans; the document holds their first values), the
    turns, the question asked where a turn asks none, and the strategy keys (`vocabulary.trajectories`)."""

    document: str
    fields: tuple[Field, ...]
    turns: tuple[Turn, ...]
    question: Question | None = None
    strategies: tuple[str, ...] = carried()
    erratum_template: str = DEFAULT_TEMPLATE


@dataclass
class TrajectoryReport:
    model: str
    document_tokens: int
    turns: list[TurnRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Summary]:
        return summaries(self.turns)

    def verdicts(self) -> dict[str, str]:
        return {k: verdict(k, s) for k, s in self.summary().items() if k != REFERENCE}


class _Eager(Editor):
    """The shared surgery, computing every changed token itself (a carried cache must be complete)."""

    def can_defer(self) -> bool:
        return False


@dataclass
class _Carried:
    """One strategy's cache as it is carried from turn to turn."""

    key: str
    strategy: Strategy
    one_per_field: bool
    ids: list[int]
    segments: list[str]
    offsets: list[tuple[int, int]]
    layers: list[KV]
    doc_tokens: int  # the frame + document piece at the front
    values: dict[str, str]  # the values its document piece holds
    told: dict[str, str]  # the values it was last told (an erratum's old value)
    errata: dict[str, tuple[int, int]] = field(default_factory=dict)  # label -> its latest erratum's span
    n_errata: int = 0
    cumulative_ttft_ms: float = 0.0
    cumulative_tokens: int = 0

    @property
    def exact(self) -> bool:
        return self.strategy.info.exact

    def notes(self, engine: LoadedModel) -> Notes:
        return Notes(list(self.ids), list(self.offsets), list(self.segments), self.layers,
                     rope=engine.rope, immobile_reason=engine.rope_error)


def check(engine: LoadedModel, request: TrajectoryRequest) -> list[str]:
    """The strategy keys, recompute first, after checking the request: every problem is one line
    naming the turn (an unknown label, an empty turn, no question, a prompt past the context)."""
    problem = unknown_keys(request.strategies)
    if problem:
        raise EngineError(problem)
    labels = {f.label for f in request.fields}
    if "" in labels or len(labels) != len(request.fields):
        raise EngineError("every field of a trajectory needs a label of its own")
    if not request.turns:
        raise EngineError("a trajectory needs at least one turn")
    context = getattr(engine.model.config, "max_position_embeddings", None)
    values = {f.label: request.document[f.start:f.end] for f in request.fields}
    appended, errata = "", 0
    for i, turn in enumerate(request.turns, 1):
        if not turn.append and not turn.fields and turn.question is None:
            raise EngineError(f"turn {i} is empty: it appends nothing, changes no field and asks nothing")
        for label, value in turn.fields:
            if label not in values:
                raise EngineError(f"turn {i} changes a field {label!r} that the document does not have "
                                  f"(fields: {', '.join(sorted(values)) or 'none'})")
            if value != values[label]:
                errata += len(engine.encode(render_erratum(label, values[label], value,
                                                           request.erratum_template)))
            values[label] = value
        question = turn.question or request.question
        if question is None or not question.text.strip():
            raise EngineError(f"turn {i} asks no question and the trajectory has none")
        appended += turn.append
        if context:
            length = (len(engine.tokenize_document(_text(request, values) + appended)[0]) + errata
                      + len(engine.encode(engine.frame.suffix(question))) + 8)
            if length > context:
                raise EngineError(f"turn {i}: the prompt would be {length} tokens (errata included), past "
                                  f"the model's context of {context}")
    return list(with_reference(request.strategies))


def _text(request: TrajectoryRequest, values: dict[str, str]) -> str:
    text = request.document
    for f in sorted(request.fields, key=lambda f: f.start, reverse=True):
        text = text[:f.start] + values[f.label] + text[f.end:]
    return text


def _build(keys: list[str]) -> dict[str, tuple[Strategy, bool]]:
    built = {}
    for key in keys:
        name, one = split_variant(key)
        strategy = EDITS.build([name])[name]
        if type(strategy).prepare is not Strategy.prepare:
            raise EngineError(f"{name} lays the document out again before its edits; a trajectory does "
                              "not carry it yet")
        built[key] = (strategy, one)
    return built


def trajectory(engine: LoadedModel, request: TrajectoryRequest, notes: Notes | None = None,
               progress: Callable[[int, TurnRecord], None] | None = None,
               cancelled: Callable[[], bool] = lambda: False) -> TrajectoryReport:
    """Every turn of `request` by every strategy, each carrying its own cache; `notes` are the
    document's cached notes (prefilled when None). `progress(turn, report)` after each turn;
    `cancelled()` is asked before each turn (True stops with the turns read so far)."""
    keys = check(engine, request)
    built = _build(keys)
    if any(s.info.moves_keys for s, _ in built.values()):
        engine.require_portable()
    old = notes if notes is not None else engine.prefill(request.document)
    engine.warm_up()
    first = {f.label: request.document[f.start:f.end] for f in request.fields}
    states = {k: _Carried(k, s, one, list(old.token_ids), list(old.segments), list(old.offsets), old.layers,
                          len(old.token_ids), dict(first), dict(first)) for k, (s, one) in built.items()}
    report = TrajectoryReport(model=engine.info.alias, document_tokens=len(old.token_ids))
    values, appended, previous = dict(first), "", dict(first)
    for index, turn in enumerate(request.turns):
        if cancelled():
            break
        changed = [label for label, value in turn.fields if value != values[label]]
        for label in changed:
            previous[label] = values[label]
        values.update(dict(turn.fields))
        appended += turn.append
        full = engine.tokenize_document(_text(request, values) + appended)
        question = turn.question or request.question
        suffix = engine.encode(engine.frame.suffix(question))
        orders = orders_suffixes(engine.tokenizer, engine.frame, question)
        moved = [label for label in values if values[label] != first[label]]
        def followed(answer: str, q: Question = question, moved: list[str] = moved) -> str | None:
            if not moved:
                return None
            return edit_followed(answer, [previous[m] for m in moved], [values[m] for m in moved], q.choices)

        tr = TurnRecord(index=index, prompt_tokens=len(full[0]), changed=changed)
        readouts = {}
        for key, state in states.items():
            t0 = time.perf_counter()
            computed = _advance(engine, request, state, turn, values, changed, full)
            readout = decide(engine.model, engine.tokenizer, engine.frame,
                             cache_from_layers(state.layers, engine.model), suffix, question, orders=orders)
            ttft = (readout.first_token_at - t0) * 1000
            state.cumulative_ttft_ms += ttft
            state.cumulative_tokens += computed
            readouts[key] = (readout, computed, ttft)
        ref = readouts[REFERENCE][0]
        for key, (readout, computed, ttft) in readouts.items():
            state, fid = states[key], fidelity(ref.logits, readout.logits)
            tr.results[key] = StrategyTurn(
                decision=readout.decision, agrees=same_answer(readout.decision, ref.decision),
                edit_followed=followed(readout.decision), kl_to_recompute=fid.kl_to_recompute,
                logit_cosine=fid.logit_cosine, tokens_computed=computed, ttft_ms=ttft,
                cumulative_ttft_ms=state.cumulative_ttft_ms, cache_tokens=len(state.ids),
                cumulative_tokens=state.cumulative_tokens, errata=state.n_errata)
        report.turns.append(tr)
        if progress is not None:
            progress(index, tr)
    return report


def _advance(engine: LoadedModel, request: TrajectoryRequest, state: _Carried, turn: Turn,
             values: dict[str, str], changed: list[str], full) -> int:
    """Carry `state` through `turn`: its appended text, then its field changes. Returns the tokens
    run through the model."""
    if state.exact:  # the whole current prompt, tokenized as one text
        ids, offsets, segments = full
        surgery = state.strategy.surgery(_case(engine, state, ids, segments, offsets, []))
        _take(engine, state, surgery)
        return surgery.tokens_computed
    computed = 0
    added = engine.encode(turn.append) if turn.append else []
    if added:
        state.layers = extend(engine.model, state.layers, added)
        state.ids += added
        state.segments += [APPENDED] * len(added)
        state.offsets += [(-1, -1)] * len(added)
        computed += len(added)
    mine = [label for label in changed if values[label] != state.told[label]]
    if not mine:
        return computed
    if state.one_per_field:
        for label in mine:
            _cut_erratum(engine, state, label)
    new_values = {**state.values, **{label: values[label] for label in mine}}
    doc_ids, doc_offsets, doc_segments = engine.tokenize_document(_text(request, new_values))
    rest = slice(state.doc_tokens, None)
    pieces = [engine.encode(render_erratum(label, state.told[label], values[label], request.erratum_template))
              for label in mine]
    case = _case(engine, state, doc_ids + state.ids[rest], doc_segments + state.segments[rest],
                 doc_offsets + state.offsets[rest], [t for p in pieces for t in p])
    before = len(state.ids)
    surgery = state.strategy.surgery(case)
    _take(engine, state, surgery)
    kept = len(state.ids) - len(surgery.pending)
    if kept == len(doc_ids) + before - state.doc_tokens and state.ids[:len(doc_ids)] == doc_ids:
        state.values, state.doc_tokens = new_values, len(doc_ids)  # the document piece was edited
    if surgery.pending and surgery.segments[-1] == ERRATUM:
        at = kept
        for label, piece in zip(mine, pieces):
            state.errata[label] = (at, at + len(piece))
            at += len(piece)
        state.n_errata += len(pieces)
    for label in mine:
        state.told[label] = values[label]
    return computed + surgery.tokens_computed


def _case(engine: LoadedModel, state: _Carried, ids, segments, offsets, erratum_ids) -> EditCase:
    editor = _Eager(engine.model, engine.rope, state.notes(engine), list(ids), list(segments), list(offsets))
    return EditCase(engine=engine, editor=editor, erratum_ids=list(erratum_ids), cached_ids=list(state.ids))


def _take(engine: LoadedModel, state: _Carried, surgery) -> None:
    """The surgery's notes as the strategy's cache, its pending tokens (an erratum) computed onto it."""
    layers = surgery.layers
    if surgery.pending:
        layers = extend(engine.model, layers, list(surgery.pending))
    state.layers, state.ids = layers, list(surgery.token_ids)
    state.segments, state.offsets = list(surgery.segments), list(surgery.offsets)


def _cut_erratum(engine: LoadedModel, state: _Carried, label: str) -> None:
    """Cut `label`'s latest erratum from the cache: the tokens after it keep their K/V, keys
    re-rotated back by its length."""
    span = state.errata.pop(label, None)
    if span is None:
        return
    a, b = span
    n = b - a
    after = shift(cut(state.layers, b, len(state.ids)), engine.rope, -n)
    state.layers = join_all([cut(state.layers, 0, a), after])
    for part in ("ids", "segments", "offsets"):
        seq = getattr(state, part)
        setattr(state, part, seq[:a] + seq[b:])
    state.errata = {k: (s - n, e - n) if s >= b else (s, e) for k, (s, e) in state.errata.items()}
    state.n_errata -= 1


def request_of(spec: TrajectorySpec) -> TrajectoryRequest:
    """The engine's request for a stored or written trajectory (`vocabulary.trajectories`): a turn
    with a question of its own asks it with its own choices (none: a free answer)."""
    fields = tuple(Field(f.start, f.end, spec.document[f.start:f.end], f.label) for f in spec.fields)
    turns = tuple(Turn(append=t.append, fields=tuple(t.fields.items()),
                       question=None if t.question is None else Question(t.question, tuple(t.choices or ())))
                  for t in spec.turns)
    return TrajectoryRequest(spec.document, fields, turns, Question(spec.question, tuple(spec.choices)),
                             tuple(spec.strategies))
