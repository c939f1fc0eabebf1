"""Pictures of a run as standalone SVG: the attention heatmap of a view (recompute, the strategy
and their difference, side by side, as on the run page) and the notes map (the document with each
span of notes coloured by the share of the decision gap it closes). The browser turns either into
a PNG (`static/js/exports.js`); the SVG is the one drawing.

Text is laid out in a monospace font on a fixed grid (the server cannot measure proportional
text), wrapped at a fixed number of characters per line, newlines kept. Each token is one
`<text class="token" data-segment=…>` whose text is the token's own, spaces and newlines included,
so the document's tokens read back as the document. Renderers collapse whitespace in SVG text, so
every run of characters is a `<tspan>` placed on the grid by itself (`x`, and `textLength` so a
fallback font cannot drift off the grid): the picture keeps its spaces whatever the renderer does.
"""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass

from app.web.runs.heatmap_view import Cell, HeatmapPanels, div_stops, hex_colour, seq_stops
from app.web.runs.notes_map_view import MapPiece
from vocabulary import REFERENCE, colours

CHAR_W, LINE_H, FONT = 7.2, 18, 12  # px: DejaVu Sans Mono 12px advances 7.2px
PAD = 12
FONT_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, monospace"
OUTLINE = ' stroke="#1d2330" stroke-width="1.5"'
SKILL_BG = "#eaf3ff"  # kvnotes.css --skill-bg: a placed skill's region in the notes map
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # XML 1.0 has no place for these
_CHUNKS = re.compile(r"\s+|\S+")


def xml_text(text: str) -> str:
    # a carriage return as &#13;: kept through XML's newline rule
    return html.escape(_CONTROL.sub("", text), quote=True).replace("\r", "&#13;")


@dataclass(frozen=True)
class Stretch:
    """A stretch of text drawn with one background; `extra` holds SVG attributes of its box."""

    text: str
    bg: str | None = None
    fg: str | None = None
    title: str = ""
    underline: str = ""  # solid | dotted
    hatched: bool = False
    outline: bool = False
    bold: bool = False
    strike: bool = False
    segment: str = ""  # a token's segment (document, question, …); "" for text that is not a token


@dataclass(frozen=True)
class Placed:
    run: Stretch
    text: str
    line: int
    col: int


def layout(runs: Iterable[Stretch], width: int) -> tuple[list[Placed], int]:
    """Place each run's characters on a `width`-character grid; a run that crosses a line end is
    cut in pieces; '\\n' ends its piece (kept in its text) and starts a new line. Returns the pieces
    and the number of lines."""
    placed: list[Placed] = []
    line = col = 0
    for run in runs:
        for k, part in enumerate(run.text.split("\n")):
            if k:
                placed.append(Placed(run, "\n", line, col))
                line, col = line + 1, 0
            while part:
                room = width - col
                # wrap before a token that fits a line
                if room <= 0 or (len(part) <= width and len(part) > room and col > 0):
                    line, col = line + 1, 0
                    continue
                piece, part = part[:room], part[room:]
                placed.append(Placed(run, piece, line, col))
                col += len(piece)
    return placed, line + 1


def _tspans(text: str, x: float, y: float) -> str:
    """`text` as tspans, each run of spaces or of other characters placed on the grid by itself."""
    out, col = [], 0
    for chunk in _CHUNKS.findall(text):
        fit = ("" if chunk.isspace()
               else f' textLength="{len(chunk) * CHAR_W:.1f}" lengthAdjust="spacingAndGlyphs"')
        out.append(f'<tspan x="{x + col * CHAR_W:.1f}" y="{y:.1f}"{fit}>{xml_text(chunk)}</tspan>')
        col += len(chunk)
    return "".join(out)


def _draw(placed: list[Placed], x0: float, y0: float) -> list[str]:
    out = []
    for p in placed:
        x, y, w = x0 + p.col * CHAR_W, y0 + p.line * LINE_H, len(p.text) * CHAR_W
        r = p.run
        if p.text == "\n":  # the line's end: kept as text, drawn as nothing
            out.append(_text(r, "\n", x, y))
            continue
        tip = f"<title>{xml_text(r.title)}</title>" if r.title else ""
        if r.bg:
            stroke = OUTLINE if r.outline else ""
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{LINE_H - 2}" '
                       f'fill="{r.bg}"{stroke}>{tip}</rect>')
        if r.hatched:
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{LINE_H - 2}" '
                       'fill="url(#hatch)"/>')
        if r.underline:
            dash = ' stroke-dasharray="2 2"' if r.underline == "dotted" else ""
            out.append(f'<line x1="{x:.1f}" x2="{x + w:.1f}" '
                       f'y1="{y + LINE_H - 3:.1f}" y2="{y + LINE_H - 3:.1f}" '
                       f'stroke="{r.fg or "#1d2330"}" stroke-width="1.5"{dash}/>')
        out.append(_text(r, p.text, x, y))
    return out


def _text(r: Stretch, text: str, x: float, y: float) -> str:
    """One piece of a stretch as a <text>: a token's carries its class and segment."""
    style = (' font-weight="700"' if r.bold else "") + (' text-decoration="line-through"' if r.strike else "")
    token = f' class="token" data-segment="{xml_text(r.segment)}"' if r.segment else ""
    return f'<text{token} fill="{r.fg or "#1d2330"}"{style}>{_tspans(text, x, y + LINE_H - 6)}</text>'


def _svg(width: float, height: float, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT_FAMILY}" font-size="{FONT}">'
            f"<title>{xml_text(title)}</title>"
            '<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)">'
            '<rect width="1" height="4" fill="rgba(0,0,0,.18)"/></pattern></defs>'
            f'<rect width="100%" height="100%" fill="#ffffff"/>{"".join(body)}</svg>')


def _ramp_bar(x: float, y: float, stops: list[str], ident: str, label: str) -> list[str]:
    gradient = "".join(f'<stop offset="{i / (len(stops) - 1):.2f}" stop-color="{c}"/>'
                       for i, c in enumerate(stops))
    return [f'<defs><linearGradient id="{ident}">{gradient}</linearGradient></defs>',
            f'<rect x="{x}" y="{y}" width="120" height="10" fill="url(#{ident})" stroke="#c4c9d3"/>',
            f'<text x="{x + 128}" y="{y + 9}" fill="#4d5566">{xml_text(label)}</text>']


def _cells(cells: list[Cell], diff: bool = False) -> list[Stretch]:
    return [Stretch(c.text, c.bg, c.fg or None, c.title,
                    underline={"pos": "solid", "neg": "dotted"}.get(c.sign, "") if diff else "",
                    hatched=c.unmatched, outline=c.query, segment=c.segment) for c in cells]


def heatmap_svg(panels: HeatmapPanels, heading: str, width_chars: int = 56) -> str:
    """Three panels side by side: recompute, the strategy, the difference (strategy − recompute)."""
    names = [REFERENCE, panels.params.strategy, "difference"]
    palette = colours()
    columns = [_cells(panels.ref), _cells(panels.res), _cells(panels.diff, diff=True)]
    panel_w = width_chars * CHAR_W + 2 * PAD
    top = 84
    body = [f'<text x="{PAD}" y="22" font-size="14" font-weight="700" fill="#1d2330">'
            f'{xml_text(heading)}</text>',
            f'<text x="{PAD}" y="42" fill="#4d5566">{xml_text(panels.params.label)}</text>']
    body += _ramp_bar(PAD, 52, [hex_colour(c) for c in seq_stops()], "seq",
                      f"attention 0 … {panels.vmax:.4f}")
    body += _ramp_bar(PAD + 3 * panel_w / 2, 52, [hex_colour(c) for c in div_stops()], "div",
                      f"strategy − recompute ±{panels.dmax:.4f}")
    lines = 0
    for k, (name, runs) in enumerate(zip(names, columns)):
        placed, n = layout(runs, width_chars)
        lines = max(lines, n)
        x0 = k * panel_w + PAD
        colour = palette.get(name)  # a strategy's own colour (its descriptor's), as the page's chip
        swatch = (f'<rect class="swatch" x="{x0}" y="{top - 15}" width="10" height="10" rx="2" '
                  f'fill="{colour}"/>')
        body.append(f'<g class="panel" data-panel="{xml_text(name)}">' + (swatch if colour else "") +
                    f'<text x="{x0 + (14 if colour else 0)}" y="{top - 6}" font-weight="700" fill="#1d2330">'
                    f'{xml_text(name)}</text>')
        body += [*_draw(placed, x0, top), "</g>"]
    return _svg(3 * panel_w, top + lines * LINE_H + PAD, body, heading)


def notes_map_svg(pieces: list[MapPiece], heading: str, summary: str, width_chars: int = 100) -> str:
    """The document with each span of notes coloured by the share of the gap it closes (orange:
    towards recompute; purple, dotted: away from it), the changed field outlined as old → new, each
    placed skill a blue region in place, its spans coloured inside it. `summary` is wrapped."""
    runs: list[Stretch] = []
    for p in pieces:
        if p.field is not None:
            runs += [Stretch(p.text, "#fff1c2", title="the changed field", outline=True, strike=True),
                     Stretch(" → ", "#fff1c2"), Stretch(p.field.new, "#ffe08a", "#5a3d00", bold=True)]
        elif p.skill:
            name = f"placed skill: {p.skill}"
            runs.append(Stretch(f"[skill: {p.skill}] ", SKILL_BG, "#1f4fb8", name, bold=True))
            runs += [_map_stretch(q, SKILL_BG) for q in p.parts]
        else:
            runs.append(_map_stretch(p))
    placed, lines = layout(runs, width_chars)
    said = textwrap.wrap(summary, width_chars) or [""]
    top = 48 + LINE_H * len(said)
    body = [f'<text x="{PAD}" y="22" font-size="14" font-weight="700" fill="#1d2330">'
            f'{xml_text(heading)}</text>']
    body += [f'<text x="{PAD}" y="{42 + LINE_H * k}" fill="#4d5566">{xml_text(line)}</text>'
             for k, line in enumerate(said)]
    body += _draw(placed, PAD, top)
    return _svg(width_chars * CHAR_W + 2 * PAD, top + lines * LINE_H + PAD, body, heading)


def _map_stretch(p: MapPiece, paper: str | None = None) -> Stretch:
    """One piece of the notes map: coloured by its share (patched alone), else on `paper`."""
    if p.share is None:
        return Stretch(p.text, paper)
    colour = hex_colour(p.colour) if p.colour else paper
    tip = f"patched alone, these notes close {100 * p.share:.1f}% of the gap left"
    return Stretch(p.text, colour, p.text_colour or None, tip, underline="dotted" if p.share < 0 else "")
