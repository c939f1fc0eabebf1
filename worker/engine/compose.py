"""Compose: a skill prefilled once, re-positioned with RoPE and spliced into any context in O(L).

A chunk prefilled alone makes its first token an attention sink, so a skill is compiled as
[start token][skill tokens] at positions 0..n and the start token is dropped when splicing: the
skill's tokens keep the notes they took with a sink before them, like in any real context.

Splicing skill S (m tokens) at token boundary t of context C (T tokens):

    C[0:t]                       unchanged
    S[1:m+1] keys re-rotated by Δ = t − 1   (positions 1..m → t..t+m−1)
    C[t:T]   keys re-rotated by Δ = m       (the tail moves to make room)

Seam repair recomputes the first K skill tokens with the real prefix C[0:t] before them.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.forward import extend
from worker.engine.notes import Notes, concat
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


def splice(model, context: Notes, skill: Notes, t: int, seam: int = 0) -> Notes:
    """`skill` (compiled with its sink) spliced into `context` before token `t`; see module doc."""
    if skill.segments and skill.segments[0] == "sink":
        body = skill.slice(1)
    else:
        body = skill
    m = body.n_tokens
    head = context.slice(0, t)
    body = body.shifted(context.first_position + t - body.first_position)
    if seam > 0 and m:
        k = min(seam, m)
        repaired = extend(model, head.layers if head.n_tokens else None, body.token_ids[:k])
        fixed = Notes(
            token_ids=body.token_ids[:k], offsets=body.offsets[:k], segments=body.segments[:k],
            layers=[(kk[:, :, t:], vv[:, :, t:]) for kk, vv in repaired],
            text=body.text, first_position=body.first_position, rope=body.rope,
        )
        body = concat([fixed, body.slice(k)])
    tail = context.slice(t).shifted(m)
    joined = concat([head, body, tail], text=context.text)
    # the skill's tokens are not document text: they carry no offsets into the context
    joined.offsets = head.offsets + [(-1, -1)] * m + tail.offsets
    joined.segments = head.segments + ["skill"] * m + tail.segments
    return joined
