"""`hoist`, the paper's hoist-to-end baseline, written against the registry.

A deployment that hoists lays the document out with each volatile field's line moved after it
(`vocabulary.hoist`) and keeps that layout's notes. An edit then changes only the tail (the moved
line with its new value): an exact prefix cache reuses everything before it, and the tail is
computed, in the readout's own forward beside the question (appended tokens, as an erratum's).

`prepare` (outside the timings, as a deployment does once): the notes of the hoisted layout before
the edit, kept on the cached notes (`Notes.derived`) so that the edits of a sweep, which all start
from the same notes and hold the same layout, prefill it once. The notes before the field's line are
the cached notes themselves (the two layouts agree there, token for token); the rest of the document
without the line, and the old tail, are prefilled after them. `surgery` (timed) keeps those notes up
to where the new layout first differs and appends the new tail. Its decision is then measured
against recompute of the edited document in its own layout, like every other strategy's;
`tokens_computed` is the tail, and the prefix cache share is measured against the hoisted layout the
deployment holds.
"""

from __future__ import annotations

from vocabulary import StrategyInfo
from vocabulary.hoist import Hoisted, hoist
from vocabulary.prefix import common_prefix
from vocabulary.strategies import FIELDS_LAST, HOIST_FIELDS
from worker.engine.edit import Surgery
from worker.engine.forward import cut, extend
from worker.engine.notes import KV
from worker.engine.offsets import NO_SPAN
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase


class Hoist(Strategy[EditCase]):
    info = StrategyInfo(
        name="hoist", kind="edit", rank=70,
        help="the field's line moved after the document: an edit computes only that tail (the paper's "
             "hoist-to-end baseline)",
        recomputes="the hoisted line holding the new value; the document without it is kept",
        can_defer=True, colour="#7b5ea7",
        serving_layout=HOIST_FIELDS, carrying=FIELDS_LAST,
    )

    def prepare(self, case: EditCase) -> None:
        engine, old = case.engine, case.editor.old
        layout = (Hoist.info.name, case.composed_text, tuple((f.start, f.end) for f in case.fields))
        if layout not in old.derived:  # the held layout, the same for every edit of a sweep: laid out once
            before = hoist(case.composed_text, case.fields, values="old")
            old.derived[layout] = engine.tokenize_document(before.text)[0]
        self.held_ids = old.derived[layout]  # what the deployment's cache holds
        after = hoist(case.composed_text, case.fields)
        ids, offsets, segments = engine.tokenize_document(after.text)
        self.new_ids, self.segments = ids, segments
        self.offsets = [_to_document(o, after, case) for o in offsets]
        reused = common_prefix(old.token_ids, self.held_ids)  # the notes before the field's line
        key = (Hoist.info.name, tuple(self.held_ids))
        if key not in old.derived:  # once per notes: every edit of a sweep holds the same layout
            old.derived[key] = extend(engine.model, cut(old.layers, 0, reused) if reused else None,
                                      self.held_ids[reused:])
        self.held: list[KV] = old.derived[key]
        self.keep = common_prefix(self.held_ids, ids)
        self.detail = (f"{len(ids) - self.keep} tail tokens after {self.keep} kept; the hoisted layout's "
                       f"{len(self.held_ids) - reused} tokens after the field's line prefilled once, untimed")

    def surgery(self, case: EditCase) -> Surgery:
        tail = self.new_ids[self.keep:]
        return Surgery(cut(self.held, 0, self.keep), list(self.new_ids), list(self.segments),
                       list(self.offsets), len(tail), self.detail, pending=list(tail))

    def cached_ids(self, case: EditCase) -> list[int]:
        return list(self.held_ids)


def _to_document(span: tuple[int, int], hoisted: Hoisted, case: EditCase) -> tuple[int, int]:
    """A token's span in the hoisted text → its span in the document the user sees."""
    if span == NO_SPAN:
        return span
    start, end = hoisted.source(*span)
    char = case.inserts.from_composed(start) if start >= 0 else -1
    return NO_SPAN if char < 0 else (char, char + end - start)
