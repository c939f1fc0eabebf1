"""The hoist-to-end layout (the paper's baseline): each volatile field's line moves after the document.

A deployment that hoists keeps the notes of the document without the field's line, and appends that
line, holding the field's current value, as a tail. An edit then changes only the tail, so an exact
prefix cache (vLLM, SGLang) reuses everything before it and computes the tail alone.

The transform is plain text so the engine's `hoist` strategy and the vLLM serving replay read one
definition:

- **A line** is the text from just after a newline (or the start) up to and including the next
  newline (or the end). A field's line is every line its span [start, end) touches; a field that
  spans several lines moves all of them, together.
- **Several fields** (a multi-field edit): every line holding a field moves, each once, in document
  order; two fields on one line move as one line with both values replaced. Overlapping fields are
  refused.
- **A field on the last line** stays where it is: the tail is that line, and the hoisted text is the
  document with the new value. When the document does not end with a newline and an earlier line
  moves, a newline is inserted before the tail so the last kept line and the tail stay separate
  lines (the hoisted text then ends with the moved line's own newline).
- **No fields**: the document unchanged, an empty tail.

The layout before the edit is `hoist(document, fields, values="old")`: the same lines moved, each
keeping its old value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol


class FieldSpan(Protocol):
    """What the transform needs of a field: a character span [start, end) and its new value
    (`worker.engine.Field` is one)."""

    start: int
    end: int
    new_value: str


@dataclass(frozen=True)
class Piece:
    """A run [start, end) of the hoisted text copied from [source_start, source_end) of the
    document; `whole`: a field's new value, which stands for the whole field."""

    start: int
    end: int
    source_start: int
    source_end: int
    whole: bool = False


@dataclass(frozen=True)
class Hoisted:
    """A hoisted document.

    text: the document without the fields' lines, then those lines (the tail).
    tail_start: where the tail begins in `text` (everything before it is the kept body).
    prefix_end: where the first moved line began in the original document: text[:prefix_end] equals
        document[:prefix_end], the part a layout change leaves untouched.
    moved: the [start, end) character spans of the original document's lines that moved.
    pieces: where each run of `text` came from (`source` reads them)."""

    text: str
    tail_start: int
    prefix_end: int
    moved: tuple[tuple[int, int], ...]
    pieces: tuple[Piece, ...] = ()

    def source(self, start: int, end: int) -> tuple[int, int]:
        """A span of `text` → the span of the original document it came from: text inside a new value
        maps to its whole field, a supplied newline to (-1, -1)."""
        for piece in self.pieces:
            if piece.start <= start < piece.end:
                if piece.whole:
                    return piece.source_start, piece.source_end
                at = piece.source_start + start - piece.start
                return at, at + end - start
        return -1, -1

    @property
    def tail(self) -> str:
        """The moved lines, holding their values."""
        return self.text[self.tail_start:]


def hoisted(document: str, fields: Sequence[FieldSpan]) -> str:
    """The hoisted document holding the fields' new values (see the module docstring)."""
    return hoist(document, fields).text


def hoist(document: str, fields: Sequence[FieldSpan],
          values: Literal["new", "old"] = "new") -> Hoisted:
    """The document with every field's line moved after it, holding the new (or old) values."""
    ordered = _checked(document, fields)
    moved = _line_spans(document, ordered)
    if not moved:
        whole = Piece(0, len(document), 0, len(document))
        return Hoisted(document, len(document), len(document), (), (whole,))
    runs = [(document[a:b], a, b, False) for a, b in _kept_spans(document, moved)]
    body = "".join(run[0] for run in runs)
    if body and not body.endswith("\n"):
        runs.append(("\n", -1, -1, False))
    body_length = sum(len(run[0]) for run in runs)
    for span in moved:
        runs += _line_runs(document, span, ordered, values)
    text, pieces, at = [], [], 0
    for chunk, a, b, whole in runs:
        if chunk and a >= 0:
            pieces.append(Piece(at, at + len(chunk), a, b, whole))
        text.append(chunk)
        at += len(chunk)
    return Hoisted("".join(text), body_length, moved[0][0], tuple(moved), tuple(pieces))


def _checked(document: str, fields: Sequence[FieldSpan]) -> list[FieldSpan]:
    """The fields in document order; a ValueError naming the field when one is out of range or two
    overlap."""
    ordered = sorted(fields, key=lambda f: (f.start, f.end))
    for f in ordered:
        if not 0 <= f.start <= f.end <= len(document):
            raise ValueError(f"field [{f.start}, {f.end}) is outside the document "
                             f"({len(document)} characters)")
    for a, b in zip(ordered, ordered[1:]):
        if b.start < a.end:
            raise ValueError(f"fields [{a.start}, {a.end}) and [{b.start}, {b.end}) overlap")
    return ordered


def _line_spans(document: str, fields: Sequence[FieldSpan]) -> list[tuple[int, int]]:
    """The lines the fields touch, merged where they share or join lines, in document order."""
    spans: list[tuple[int, int]] = []
    for f in fields:
        start = document.rfind("\n", 0, f.start) + 1
        newline = document.find("\n", max(f.end - 1, f.start))
        end = len(document) if newline < 0 else newline + 1
        if spans and start < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((start, end))
    return spans


def _kept_spans(document: str, moved: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The complement of `moved` in the document."""
    kept, at = [], 0
    for a, b in moved:
        kept.append((at, a))
        at = b
    kept.append((at, len(document)))
    return kept


def _line_runs(document: str, span: tuple[int, int], fields: Sequence[FieldSpan],
               values: str) -> list[tuple[str, int, int, bool]]:
    """One moved line as runs (text, source start, source end, whole), its fields' values in place
    (new ones, or the document's own)."""
    a, b = span
    if values == "old":
        return [(document[a:b], a, b, False)]
    runs, at = [], a
    for f in fields:
        if a <= f.start and f.end <= b:
            runs += [(document[at:f.start], at, f.start, False), (f.new_value, f.start, f.end, True)]
            at = f.end
    runs.append((document[at:b], at, b, False))
    return runs
