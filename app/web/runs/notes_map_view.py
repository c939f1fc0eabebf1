"""The notes map as every picture of a run draws it (run page, report, presentation, SVG): the
document cut at every field, span and placed-skill boundary, each piece with the share of the
decision gap its notes closed; each placed skill as a region of its own, in place; and the words
that say what the shares are.

What a share is (`worker.engine.attribution`): each is that patch alone, never a part of a whole.
The fields' share is of the whole stale → recompute gap; a span's is of the gap left once the fields
are refreshed in place (in_place → recompute), so 40% on a span after a field at 97% is 40% of the
remaining 3%. Patches overlap in what they carry, so the shares do not add up, and the page says so.
With several fields each is named with its own share (that field refreshed alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.web.runs.heatmap_view import text_on
from data.contracts import NotesMap, NotesSpan, RunSnapshot, SnapshotField, SnapshotPlacement

MAP_POS, MAP_NEG = (230, 97, 1), (94, 60, 153)  # kvnotes.css .map-span: orange towards recompute, purple away


@dataclass(frozen=True)
class MapPiece:
    """A stretch of the notes map: its text, the share of the decision gap its notes closed when
    patched from recompute (None outside every span), whether it is a changed field, and for a
    placed skill (`skill`: its name) the skill's text in `parts`, each with its own share."""

    text: str
    share: float | None = None
    field: SnapshotField | None = None
    skill: str = ""
    parts: tuple[MapPiece, ...] = ()

    @property
    def alpha(self) -> float:
        """Colour strength: the square root of the share's size (small shares stay visible), ≤ 1."""
        return min(abs(self.share or 0.0), 1.0) ** 0.5

    @property
    def colour(self) -> tuple[int, int, int] | None:
        """The span's colour over white paper (kvnotes.css mixes the same two at `alpha`)."""
        if self.share is None:
            return None
        base = MAP_NEG if self.share < 0 else MAP_POS
        return tuple(round(255 + (c - 255) * self.alpha) for c in base)  # type: ignore[return-value]

    @property
    def text_colour(self) -> str:
        """"" where the page's ink reads on the span, else white or black (WCAG AA)."""
        return text_on(self.colour) if self.colour else ""


def notes_map_pieces(snapshot: RunSnapshot, notes_map: NotesMap) -> list[MapPiece]:
    """The document cut at every field, span and skill boundary, each piece with its span's share;
    each placed skill a region holding its own text, cut by the spans that read it."""
    document = snapshot.document
    skills = _placed(snapshot, len(document))
    spans = [s for s in notes_map.spans if 0 <= s.start_char < s.end_char <= len(document)]
    cuts = {0, len(document), *(p for p, _ in skills)}
    for f in snapshot.fields:
        cuts |= {f.start, f.end}
    for s in spans:
        cuts |= {s.start_char, s.end_char}
    pure = [(k, s) for k, s in enumerate(notes_map.spans) if s.start_char < 0]  # spans of skill notes only
    pieces: list[MapPiece] = []
    bounds = sorted(c for c in cuts if 0 <= c <= len(document))
    for a, b in zip(bounds, [*bounds[1:], None]):
        for _, placement in (s for s in skills if s[0] == a):
            parts, pure = _skill_parts(placement.text, _straddling(document, a, notes_map.spans), pure)
            inside, after = _line_ends_after(parts)
            pieces.append(MapPiece(placement.text, skill=placement.name or "skill", parts=tuple(inside)))
            pieces += after
        if b is None:
            break
        field = next((f for f in snapshot.fields if f.start <= a and b <= f.end), None)
        span = next((s for s in spans if s.start_char <= a and b <= s.end_char), None)
        pieces.append(MapPiece(document[a:b], None if span is None else span.share, field))
    return pieces


def _placed(snapshot: RunSnapshot, length: int) -> list[tuple[int, SnapshotPlacement]]:
    """Each placement's document offset (the end for None; moved to a field's end when inside one)."""
    out = []
    for p in snapshot.placements:
        at = length if p.position is None else min(max(p.position, 0), length)
        at = next((f.end for f in snapshot.fields if f.start < at < f.end), at)
        out.append((at, p))
    return sorted(out, key=lambda x: x[0])


Read = tuple[int, str, float]  # (span index, the text it read inside a skill, its share)


def _straddling(document: str, at: int, spans: list[NotesSpan]) -> list[Read]:
    """Spans with document text on one or both sides of a skill placed at `at` whose text runs into
    the skill: the part of their text that is the skill's."""
    out = []
    for k, s in enumerate(spans):
        if 0 <= s.start_char <= at <= s.end_char:
            before, after = document[s.start_char:at], document[at:s.end_char]
            inner = len(s.text) - len(before) - len(after)
            if inner > 0 and s.text.startswith(before) and s.text.endswith(after):
                out.append((k, s.text[len(before):len(before) + inner], s.share))
    return out


def _skill_parts(text: str, straddling: list[Read], pure: list[tuple[int, NotesSpan]]
                 ) -> tuple[list[MapPiece], list[tuple[int, NotesSpan]]]:
    """The skill's text cut by the spans that read it, in order (each with its share): the spans
    running in from the document around it, and the skill-only spans found in it, which are used
    up (the rest are the next skill's)."""
    taken = 0
    cursor = 0
    for _, s in pure:  # the skill-only spans, in order, while they are found in this skill's text
        at = text.find(s.text, cursor) if s.text else -1
        if at < 0:
            break
        cursor, taken = at + len(s.text), taken + 1
    reads = sorted(straddling + [(k, s.text, s.share) for k, s in pure[:taken]])
    parts: list[MapPiece] = []
    cursor = 0
    for _, read, share in reads:
        at = text.find(read, cursor)
        if at < 0:
            continue
        if at > cursor:
            parts.append(MapPiece(text[cursor:at]))
        parts.append(MapPiece(read, share))
        cursor = at + len(read)
    if cursor < len(text):
        parts.append(MapPiece(text[cursor:]))
    return parts, pure[taken:]


def _line_ends_after(parts: list[MapPiece]) -> tuple[list[MapPiece], list[MapPiece]]:
    """A skill's parts without the newlines that end it, and those newlines (with their shares) to
    draw after its region, so the region does not spill onto an empty line."""
    inside, after = list(parts), []
    while inside and inside[-1].text.endswith("\n"):
        last = inside.pop()
        body = last.text.rstrip("\n")
        after.insert(0, MapPiece(last.text[len(body):], last.share))
        if body:
            inside.append(MapPiece(body, last.share))
            break
    return inside, after


def top_spans(notes_map: NotesMap, n: int = 5) -> list[NotesSpan]:
    """The spans whose patch moved the decision most, either way: the largest shares of the gap
    closed, and a negative one (the patch moved it away from recompute) as large is listed too."""
    return sorted(notes_map.spans, key=lambda s: abs(s.share), reverse=True)[:n]


# ---- the words ------------------------------------------------------------------------------------


def field_name(field: SnapshotField) -> str:
    return f"the {field.label} field" if field.label else f"the field “{field.old[:40]}”"


def field_shares(snapshot: RunSnapshot, notes_map: NotesMap) -> list[tuple[str, float]]:
    """(name, share) of each field refreshed alone: one entry per changed stretch the run measured,
    named by the fields it covers ("the status and region fields" when they were too close to
    refresh apart). With one field (or a run from before per-field shares) the fields together."""
    fields = sorted(snapshot.fields, key=lambda f: f.start)
    if len(notes_map.edits) > 1:
        out = []
        for e in notes_map.edits:
            named = [f for f in fields if f.start < e.end_char and e.start_char < f.end]
            out.append((_names(named) or "a changed stretch", e.share))
        return out
    return [(_names(fields) or "the changed text", notes_map.field_share)]


def _names(fields: list[SnapshotField]) -> str:
    if len(fields) <= 1:
        return field_name(fields[0]) if fields else ""
    labels = [f.label or f"“{f.old[:40]}”" for f in fields]
    return f"the {', '.join(labels[:-1])} and {labels[-1]} fields"


def lead_parts(snapshot: RunSnapshot, notes_map: NotesMap) -> list[tuple[str, bool]]:
    """The notes map's first sentence as (text, emphasised) parts: each field's own share by name."""
    shares = field_shares(snapshot, notes_map)
    if len(shares) == 1:
        name, share = shares[0]
        return [(f"Refreshing {name}'s own notes closed ", False), (f"{100 * share:.0f}%", True),
                (" of the gap between the stale notes and recompute.", False)]
    parts: list[tuple[str, bool]] = [("Refreshed alone, ", False)]
    for k, (name, share) in enumerate(shares):
        parts += [(", " if k else "", False), (f"{name}'s own notes closed ", False),
                  (f"{100 * share:.0f}%", True)]
    parts += [(" of the gap between the stale notes and recompute; all the fields together ", False),
              (f"{100 * notes_map.field_share:.0f}%", True), (".", False)]
    return parts


def lead_text(snapshot: RunSnapshot, notes_map: NotesMap) -> str:
    return "".join(text for text, _ in lead_parts(snapshot, notes_map))


def remaining(notes_map: NotesMap) -> float:
    """The part of the whole stale → recompute gap still open with the fields refreshed: what a
    span's share is a share of."""
    return notes_map.kl_in_place / notes_map.kl_stale if notes_map.kl_stale > 0 else 0.0


def of_whole(span: NotesSpan, notes_map: NotesMap) -> float:
    """A span's share told as a share of the whole stale → recompute gap."""
    return span.share * remaining(notes_map)
