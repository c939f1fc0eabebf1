"""The document as the notebook page draws it: a flat list of pieces (plain text, field chips,
skill placements, drop zones between paragraphs) in document order, each carrying the character
offsets it covers so `selection.js` can map a mouse selection back to offsets in the raw text.

Also the approximate-or-exact token arithmetic the page shows before and after a run: the app
cannot tokenize, so costs are characters ÷ 4 ("≈") until a run's `tokens` give exact counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.web.templating import approx_tokens
from data.contracts import TokenRecord
from data.models import Field, Placement, RunResult
from vocabulary import FLOOR

PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")


@dataclass
class Piece:
    kind: str  # "text" | "field" | "placement" | "dropzone"
    start: int
    end: int
    text: str = ""
    field: Field | None = None
    placement: Placement | None = None
    shift: int = 0  # placements: RoPE shift in positions
    shift_exact: bool = False
    at_end: bool = False


@dataclass
class DocumentView:
    pieces: list[Piece] = field(default_factory=list)
    length: int = 0


def paragraph_starts(document: str) -> list[int]:
    """Offsets where a paragraph begins after a blank line: the places a skill can be dropped."""
    return [m.end() for m in PARAGRAPH_BREAK.finditer(document) if m.end() < len(document)]


def document_tokens_before(position: int, tokens: list[TokenRecord] | None) -> int | None:
    """Exact RoPE shift of a splice at `position` from a run's tokens: the frame tokens ahead of
    the document plus the document tokens ending at or before the position. None without tokens."""
    if not tokens:
        return None
    count = 0
    for tok in tokens:
        if tok.segment == "frame":
            count += 1
        elif tok.segment == "document":
            if tok.end <= position:
                count += 1
            else:
                break
    return count


def build_document_view(
    document: str,
    fields: list[Field],
    placements: list[Placement],
    tokens: list[TokenRecord] | None = None,
) -> DocumentView:
    """Pieces in order. Fields are assumed not to overlap (the service refuses overlaps); a
    placement inside a field is drawn right after it."""
    length = len(document)
    stops: dict[int, list[tuple[int, Any]]] = {}  # offset → [(order, thing)]
    for pos in paragraph_starts(document):
        stops.setdefault(pos, []).append((0, "dropzone"))
    for p in placements:
        pos = length if p.position is None else min(max(p.position, 0), length)
        stops.setdefault(pos, []).append((1, p))

    def emit_stops(view: DocumentView, pos: int) -> None:
        for _, thing in sorted(stops.pop(pos, []), key=lambda s: (s[0], getattr(s[1], "id", 0))):
            if thing == "dropzone":
                view.pieces.append(Piece("dropzone", pos, pos))
            else:
                exact = document_tokens_before(pos, tokens)
                shift = exact if exact is not None else approx_tokens(document[:pos])
                at_end = thing.position is None
                view.pieces.append(
                    Piece("placement", pos, pos, placement=thing, shift=shift, shift_exact=exact is not None,
                          at_end=at_end)
                )

    live = [f for f in sorted(fields, key=lambda f: f.start) if 0 <= f.start < f.end <= length]
    for f in live:  # stops strictly inside a field move to its end
        for pos in [p for p in list(stops) if f.start < p < f.end]:
            stops.setdefault(f.end, []).extend(stops.pop(pos))
    field_at = {f.start: f for f in live}
    cuts = sorted({0, length, *stops, *field_at, *(f.end for f in live)})

    view = DocumentView(length=length)
    for here, nxt in zip(cuts, [*cuts[1:], None], strict=True):
        emit_stops(view, here)
        if nxt is None:
            break
        f = field_at.get(here)
        if f is not None and f.end == nxt:
            view.pieces.append(Piece("field", here, nxt, text=document[here:nxt], field=f))
        elif nxt > here:
            view.pieces.append(Piece("text", here, nxt, text=document[here:nxt]))
    view.pieces.append(Piece("dropzone", length, length, at_end=True))
    return view


def tokens_for_document(document: str, results: list[RunResult]) -> list[TokenRecord]:
    """The cached tokens of a finished run whose document offsets fit this text as it is now (the
    stale strategy reads the original document; recompute reads the edited one). Empty if none fit."""
    for result in sorted(results, key=lambda r: 0 if r.strategy == FLOOR else 1):
        tokens = result.tokens or []
        doc_tokens = [t for t in tokens if t.in_document]
        if doc_tokens and _tokens_fit(document, doc_tokens):
            return tokens
    return []


def hover_tokens(tokens: list[TokenRecord]) -> list[dict[str, Any]]:
    """The document tokens with their index in the cached sequence: the JSON the page hovers over."""
    return [
        {"i": i, "id": t.id, "text": t.text, "start": t.start, "end": t.end}
        for i, t in enumerate(tokens)
        if t.in_document
    ]


def _tokens_fit(document: str, doc_tokens: list[TokenRecord]) -> bool:
    """Most sampled tokens read, at their offsets, the text they were decoded from."""
    if doc_tokens[-1].end > len(document):
        return False
    step = max(1, len(doc_tokens) // 50)
    sample = doc_tokens[::step]
    hits = sum(1 for t in sample if document[t.start:t.end].strip() == _plain(t.text))
    return hits >= 0.8 * len(sample)


def _plain(token_text: str) -> str:
    """A token's text without byte-level BPE's space markers."""
    return token_text.replace("Ġ", " ").replace("▁", " ").strip()
