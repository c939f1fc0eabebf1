"""How one strategy's cache is carried through a turn of a trajectory (`worker.engine.trajectory`),
as its descriptor's `carrying` says (never its name):

- `OWN_SURGERY`: the skill the turn places spliced on (`splice_skill`), its appended text
  prefilled, then its field changes applied by the strategy's own surgery (errata cut and appended
  for the one_per_field variant);
- `WHOLE_PROMPT`: its surgery on the whole current prompt, tokenized as one text;
- `FIELDS_LAST`: the document laid out once without the fields' lines (`lay_out_hoisted`), and the
  block of those lines kept last, prefilled again after every turn's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from vocabulary import render_erratum
from vocabulary.prefix import common_prefix
from vocabulary.regions import ERRATUM
from vocabulary.strategies import WHOLE_PROMPT
from vocabulary.trajectories import FieldSpec, hoisted_prompt
from worker.engine.compose import body_of
from worker.engine.edit import Editor, shift
from worker.engine.forward import cut, extend, join_all
from worker.engine.loaded import LoadedModel
from worker.engine.notes import KV, Notes
from worker.engine.strategies import Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.types import Field

APPENDED = "turn"  # the segment of a turn's appended tokens
BLOCK = "field_block"  # the segment of hoist's field block


class Document(Protocol):
    """What carrying reads of a trajectory's request (`worker.engine.trajectory.TrajectoryRequest`)."""

    document: str
    fields: tuple[Field, ...]
    erratum_template: str


@dataclass
class Carried:
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
    block: int = -1  # FIELDS_LAST: its field block's length at the end of the cache (-1: not laid out yet)
    spliced: int = 0  # this turn's skill tokens spliced in

    @property
    def hoisted(self) -> bool:
        return self.block >= 0

    @property
    def whole_prompt(self) -> bool:
        return self.strategy.info.carrying == WHOLE_PROMPT

    def notes(self, engine: LoadedModel) -> Notes:
        return Notes(list(self.ids), list(self.offsets), list(self.segments), self.layers,
                     rope=engine.rope, immobile_reason=engine.rope_error)


def document_with(request: Document, values: dict[str, str]) -> str:
    """The document holding the fields' `values` (recompute's document part at a turn)."""
    text = request.document
    for f in sorted(request.fields, key=lambda f: f.start, reverse=True):
        text = text[:f.start] + values[f.label] + text[f.end:]
    return text


def advance(engine: LoadedModel, request: Document, state: Carried, append: str,
            values: dict[str, str], changed: list[str], full, appended: str, skill: Notes | None) -> int:
    """Carry `state` through a turn: the `skill` it places (compiled notes), the text it appends
    (`append`; `appended`: every turn's so far), then its field changes (`changed`, to `values`);
    `full`: recompute's tokens of the whole prompt. Returns the tokens run through the model."""
    state.spliced = 0
    if state.whole_prompt:  # the whole current prompt, tokenized as one text
        ids, offsets, segments = full
        surgery = state.strategy.surgery(_case(engine, state, ids, segments, offsets, []))
        _take(engine, state, surgery)
        return surgery.tokens_computed
    if state.hoisted:  # the field block comes off the end, to go back after this turn's text
        end = len(state.ids) - state.block
        state.layers = cut(state.layers, 0, end)
        state.ids, state.segments, state.offsets = state.ids[:end], state.segments[:end], state.offsets[:end]
    if skill is not None:
        splice_skill(state, skill)
    computed = _append(engine, state, engine.encode(append) if append else [], APPENDED)
    if state.hoisted:
        _, block = hoisted_prompt(request.document, _field_specs(request), values, appended)
        state.block = _append(engine, state, engine.encode(block) if block else [], BLOCK)
        return computed + state.block
    mine = [label for label in changed if values[label] != state.told[label]]
    if not mine:
        return computed
    if state.one_per_field:
        for label in mine:
            _cut_erratum(engine, state, label)
    new_values = {**state.values, **{label: values[label] for label in mine}}
    doc_ids, doc_offsets, doc_segments = engine.tokenize_document(document_with(request, new_values))
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


def _append(engine: LoadedModel, state: Carried, ids: list[int], segment: str) -> int:
    """Prefill `ids` onto the cache; how many."""
    if ids:
        state.layers = extend(engine.model, state.layers, ids)
        state.ids += ids
        state.segments += [segment] * len(ids)
        state.offsets += [(-1, -1)] * len(ids)
    return len(ids)


def splice_skill(state: Carried, skill: Notes) -> None:
    """The compiled skill (its sink dropped) after the cache: its keys re-rotated to the positions
    that follow, its values as they are; one copy per layer, no token computed."""
    body = body_of(skill)
    moved = body.shifted(len(state.ids) - body.first_position)
    state.layers = join_all([state.layers, moved.layers])
    state.ids += body.token_ids
    state.segments += ["skill"] * body.n_tokens
    state.offsets += [(-1, -1)] * body.n_tokens
    state.spliced = body.n_tokens


def _field_specs(request: Document) -> list[FieldSpec]:
    return [FieldSpec(f.label, f.start, f.end) for f in request.fields]


def lay_out_hoisted(engine: LoadedModel, request: Document, state: Carried, old: Notes,
                     values: dict[str, str]) -> None:
    """A `FIELDS_LAST` strategy's notes before the first turn: the document without its fields'
    lines (the notes before the first moved line are the document's own, the rest prefilled), then
    the field block; done once, outside the timings, as its deployment lays the document out once."""
    kept, block = hoisted_prompt(request.document, _field_specs(request), values, "")
    ids, offsets, segments = engine.tokenize_document(kept)
    reused = common_prefix(old.token_ids, ids)
    layers = extend(engine.model, cut(old.layers, 0, reused) if reused else None, ids[reused:])
    state.ids, state.offsets, state.segments, state.layers = ids, offsets, segments, layers
    state.doc_tokens, state.block = len(ids), 0
    state.block = _append(engine, state, engine.encode(block) if block else [], BLOCK)


def _case(engine: LoadedModel, state: Carried, ids, segments, offsets, erratum_ids) -> EditCase:
    # every changed token computed by the surgery itself: a carried cache must be complete
    editor = Editor(engine.model, engine.rope, state.notes(engine), list(ids), list(segments),
                    list(offsets)).eager()
    return EditCase(engine=engine, editor=editor, erratum_ids=list(erratum_ids), cached_ids=list(state.ids))


def _take(engine: LoadedModel, state: Carried, surgery) -> None:
    """The surgery's notes as the strategy's cache, its pending tokens (an erratum) computed onto it."""
    layers = surgery.layers
    if surgery.pending:
        layers = extend(engine.model, layers, list(surgery.pending))
    state.layers, state.ids = layers, list(surgery.token_ids)
    state.segments, state.offsets = list(surgery.segments), list(surgery.offsets)


def _cut_erratum(engine: LoadedModel, state: Carried, label: str) -> None:
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
