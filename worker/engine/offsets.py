"""Character offsets across the three texts of a run, so every strategy's tokens can be drawn over
the one document the user sees.

- the **document**: what the user wrote (field offsets point into it);
- the **composed text**: the document with every placed skill's text inserted (what the spliced
  notes hold, and what recompute reads before the fields change);
- the **new text**: the composed text with every field's new value in place of its old one.

A skill placed at document character `at` goes in *before* that character: it moves a field that
starts at `at`, not one that ends there.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.types import Field

NO_SPAN = (-1, -1)  # a token that is not document text: frame, skill, erratum, question


@dataclass(frozen=True)
class Insertions:
    """Skill texts inserted into the document: (document char, length), sorted by char."""

    at: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, pairs: list[tuple[int, int]]) -> Insertions:
        return cls(tuple(sorted(pairs)))

    def to_composed(self, char: int, is_end: bool = False) -> int:
        """A document offset → the same place in the composed text. `is_end`: the offset closes a
        span, so a skill inserted exactly there stays after it."""
        return char + sum(n for at, n in self.at if (at < char if is_end else at <= char))

    def from_composed(self, char: int) -> int:
        """A composed-text offset → the document offset, or -1 inside an inserted skill."""
        shift = 0
        for at, n in self.at:
            if char < at + shift:
                break
            if char < at + shift + n:
                return -1
            shift += n
        return char - shift

    def move(self, field: Field) -> Field:
        """`field` with its span moved into the composed text."""
        return Field(self.to_composed(field.start), self.to_composed(field.end, is_end=True), field.new_value,
                     field.label)


def apply_fields(text: str, fields: list[Field]) -> str:
    """`text` with every field's span replaced by its new value (fields must not overlap)."""
    for f in sorted(fields, key=lambda f: f.start, reverse=True):
        text = text[: f.start] + f.new_value + text[f.end :]
    return text


def new_to_document(span: tuple[int, int], fields: list[Field], inserts: Insertions) -> tuple[int, int]:
    """A token's span in the new text → its span in the document. Text inside a new value maps to
    its whole field; text inside a skill maps to NO_SPAN. `fields` are in document offsets."""
    if span == NO_SPAN:
        return span
    start = span[0]
    delta = 0  # how far the new text has run ahead of the composed text so far
    for f in sorted(fields, key=lambda f: f.start):
        cs, ce = inserts.to_composed(f.start), inserts.to_composed(f.end, is_end=True)
        new_start, new_end = cs + delta, cs + delta + len(f.new_value)
        if start < new_start:
            break
        if start < new_end:
            return (f.start, f.end)
        delta += len(f.new_value) - (ce - cs)
    char = inserts.from_composed(start - delta)
    if char < 0:
        return NO_SPAN
    return (char, char + (span[1] - span[0]))
