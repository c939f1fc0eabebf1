"""Compose: a skill prefilled once, re-positioned with RoPE and spliced into any context in O(L).

A chunk prefilled alone makes its first token an attention sink, so a skill is compiled as
[start token][skill tokens] at positions 0..n and the start token is dropped when splicing: the
skill's tokens keep the notes they took with a sink before them, like in any real context.

Splicing skill S (m tokens) at token boundary t of context C (T tokens):

    C[0:t]                       unchanged
    S[1:m+1] keys re-rotated by Δ = t − 1   (positions 1..m → t..t+m−1)
    C[t:T]   keys re-rotated by Δ = m       (the tail moves to make room)

Seam repair recomputes the first K skill tokens with the real prefix C[0:t] before them.

Many skills are laid out at once (`lay_out`) and spliced with ONE copy per layer (`splice_all`):
every piece (a run of the context, a skill's body) is re-rotated to its final position and the
pieces are concatenated; seam repair then recomputes the first K tokens of every skill in one
forward, each seeing the real prefix before it (`worker.engine.selective.recompute_selected`).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.notes import Notes, concat
from worker.engine.selective import recompute_selected
from worker.engine.types import EngineError


@dataclass(frozen=True)
class Placement:
    """A skill to splice into the document before character `at` (None = at the end)."""

    text: str
    at: int | None = None
    notes: Notes | None = None  # the compiled skill; compiled on the fly when missing
    seam: int = 0


def token_boundary(notes: Notes, at_char: int | None) -> tuple[int, int]:
    """The first document token starting at or after `at_char` → (token index, its char offset).
    None, or a position past the last document token, means the end of the notes."""
    if at_char is None:
        return notes.n_tokens, len(notes.text)
    if at_char < 0 or at_char > len(notes.text):
        raise EngineError(f"splice position {at_char} is outside the document (0..{len(notes.text)})")
    for i, ((start, _end), seg) in enumerate(zip(notes.offsets, notes.segments)):
        if seg == "document" and start >= at_char:
            return i, start
    return notes.n_tokens, len(notes.text)


@dataclass(frozen=True)
class Layout:
    """Where each skill lands when skill i goes before context token `at_tokens[i]`.

    order: skill indices in composition order (by position, then as given); spans: each skill's
    tokens [start, end) in the composed notes, in that order; token_ids, offsets, segments: the
    composed prompt's tokens (a skill's tokens carry no offsets into the context's text)."""

    at_tokens: tuple[int, ...]
    order: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    token_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    segments: tuple[str, ...]

    @property
    def first_skill(self) -> tuple[int, int]:
        return self.spans[0] if self.spans else (len(self.token_ids), len(self.token_ids))


def body_of(skill: Notes) -> Notes:
    """A compiled skill without its sink token."""
    return skill.slice(1) if skill.segments[:1] == ["sink"] else skill


def lay_out(context: Notes, skills: list[Notes], at_tokens: list[int]) -> Layout:
    order = sorted(range(len(skills)), key=lambda i: (at_tokens[i], i))
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    segments: list[str] = []
    spans = []
    last = 0
    for i in order:
        t = at_tokens[i]
        ids += context.token_ids[last:t]
        offsets += context.offsets[last:t]
        segments += context.segments[last:t]
        body = body_of(skills[i]).token_ids
        spans.append((len(ids), len(ids) + len(body)))
        ids += body
        offsets += [(-1, -1)] * len(body)
        segments += ["skill"] * len(body)
        last = t
    ids += context.token_ids[last:]
    offsets += context.offsets[last:]
    segments += context.segments[last:]
    return Layout(tuple(at_tokens), tuple(order), tuple(spans), tuple(ids), tuple(offsets), tuple(segments))


def splice_all(model, context: Notes, skills: list[Notes], layout: Layout,
               seams: list[int] | None = None) -> Notes:
    """Every skill spliced into `context` as `layout` says (one copy per layer), then the first
    `seams[i]` tokens of skill i recomputed with the real prefix before them (one forward)."""
    pieces = []
    inserted, last = 0, 0
    for i, (start, _end) in zip(layout.order, layout.spans):
        t = layout.at_tokens[i]
        pieces.append(context.slice(last, t).shifted(inserted))
        body = body_of(skills[i])
        pieces.append(body.shifted(context.first_position + start - body.first_position))
        inserted += body.n_tokens
        last = t
    pieces.append(context.slice(last).shifted(inserted))
    joined = concat(pieces, text=context.text)
    joined.offsets, joined.segments = list(layout.offsets), list(layout.segments)
    repaired = [j for i, (start, end) in zip(layout.order, layout.spans)
                for j in range(start, min(end, start + (seams[i] if seams else 0)))]
    if repaired:
        joined.layers = recompute_selected(model, joined.layers, list(layout.token_ids), repaired)
    return joined


def splice(model, context: Notes, skill: Notes, t: int, seam: int = 0) -> Notes:
    """`skill` (compiled with its sink) spliced into `context` before token `t`; see module doc."""
    return splice_all(model, context, [skill], lay_out(context, [skill], [t]), [seam])
