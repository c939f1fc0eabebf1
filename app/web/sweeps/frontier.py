"""The sweep page's frontier, drawn on the server as one SVG: changed-edit agreement (with its 95%
confidence sequence as a bar) against the share of recompute's tokens on a log axis, one filled
point per strategy of this sweep, one hollow square per point of the paper's 8B model, and the
policy's threshold as a dashed line.

It has to read at 390 px as at 1280 px: the drawing is 400 units wide (its legend under the plot,
not beside it) and scales with its box (at most 560 px wide: `svg.frontier` in the stylesheet).
Labels never sit on each other, on a point or on a bar: each label takes the first free place
around its point (right, left, above, below, then further up or down with a leader line), this
sweep's strategies first. Points closer than a bar's width apart on the
cost axis are spread sideways so their intervals stay apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from app.services.sweep_view import SweepView

W, H = 480, 420  # RIGHT leaves room for the labels of the points at 100% (issue 43)
LEFT, RIGHT, TOP = 44, 92, 14
PLOT_BOTTOM = 332  # the plot's lower edge; the axis labels and the legend below it
X_MIN = 1e-3  # cost share on a log axis: 0.1% .. 100%
FONT = 11
CHAR_W = 6.6  # an estimate (on the wide side) of one character's width at FONT, for the label boxes
MINE, PAPER = "#1f5fa8", "#b4580a"
SPREAD = 9.0  # the least distance between two of this sweep's interval bars


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    def hits(self, other: Box) -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1


@dataclass(frozen=True)
class Label:
    """A placed label: its text's anchor point and alignment, its box, and where its leader line
    starts (None: it sits beside its point)."""

    index: int  # the point's
    text: str
    x: float
    y: float
    anchor: str
    box: Box
    leader: tuple[float, float] | None = None


def x_of(share: float) -> float:
    share = min(1.0, max(X_MIN, share))
    return LEFT + (math.log10(share) - math.log10(X_MIN)) / -math.log10(X_MIN) * (W - LEFT - RIGHT)


def y_of(p: float) -> float:
    return TOP + (1 - p) * (PLOT_BOTTOM - TOP)


def _box(text: str, x: float, y: float, anchor: str) -> Box:
    width = CHAR_W * len(text)
    x0 = x if anchor == "start" else x - width if anchor == "end" else x - width / 2
    return Box(x0 - 1, y - FONT, x0 + width + 1, y + 3)


def _candidates(x: float, y: float):
    """Places around a point, nearest first: (text x, baseline y, anchor, needs a leader). After the
    eight next to it, every place within `NEAR` px on either side, by distance (issue 43: labels
    went far up or down, on long crossing lines, even below the threshold line from points at
    1.00); only then the far places."""
    yield x + 7, y + 4, "start", False
    yield x - 7, y + 4, "end", False
    yield x, y - 8, "middle", False
    yield x, y + 16, "middle", False
    yield x + 7, y - 7, "start", False
    yield x + 7, y + 15, "start", False
    yield x - 7, y - 7, "end", False
    yield x - 7, y + 15, "end", False
    near = sorted((math.hypot(dx, dy), x + sign * dx, y + dy + 4, anchor)
                  for dy in range(-NEAR // 2, NEAR // 2 + 1, 12) for dx in (10, 24, 44, 70, 100)
                  for sign, anchor in ((1, "start"), (-1, "end")) if math.hypot(dx, dy) <= NEAR)
    for _, tx, ty, anchor in near:
        yield tx, ty, anchor, True
    for step in range(1, 28):
        for dy in (-12 * step - 8, 12 * step + 16):
            for dx, anchor in ((10, "start"), (-10, "end"), (40, "start"), (-40, "end")):
                yield x + dx, y + dy, anchor, True


NEAR = 180  # drawing units: how far a label looks for a free place beside its point before going far


def place_labels(points: list[tuple[str, float, float]], taken: list[Box]) -> list[Label]:
    """Labels for `points` ((text, x, y), in priority order) that overlap no other label, no point
    and nothing in `taken`, inside the drawing; a label with no free place is dropped (its point's
    tooltip still names it)."""
    markers = [Box(x - 5, y - 5, x + 5, y + 5) for _, x, y in points]
    placed: list[Label] = []
    for index, (text, x, y) in enumerate(points):
        for tx, ty, anchor, leader in _candidates(x, y):
            box = _box(text, tx, ty, anchor)
            if box.x0 < 1 or box.x1 > W - 1 or box.y0 < 1 or box.y1 > PLOT_BOTTOM + 8:
                continue
            if any(box.hits(b) for b in taken) or any(box.hits(m) for m in markers) or \
                    any(box.hits(label.box) for label in placed):
                continue
            placed.append(Label(index, text, tx, ty, anchor, box, (x, y) if leader else None))
            break
    return placed


def spread(xs: list[float], gap: float = SPREAD) -> list[float]:
    """The x positions moved sideways as little as needed so that no two are closer than `gap`
    (clusters centred on where they were), order kept."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = list(xs)
    groups: list[list[int]] = []
    for i in order:
        if groups and xs[i] - xs[groups[-1][-1]] < gap:
            groups[-1].append(i)
        else:
            groups.append([i])
    for group in groups:
        centre = sum(xs[i] for i in group) / len(group)
        first = centre - gap * (len(group) - 1) / 2
        first = min(max(first, LEFT), W - RIGHT - gap * (len(group) - 1))  # inside the plot
        for k, i in enumerate(group):
            out[i] = first + gap * k
    return out


def _axes(threshold: float) -> tuple[list[str], list[Box]]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{PLOT_BOTTOM - TOP}" '
           'fill="none" stroke="#999"/>']
    ticks: list[Box] = []  # the axes' own labels: a point's label never covers one
    for p in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = y_of(p)
        ticks.append(_box(f"{p:.2f}", LEFT - 6, y + 4, "end"))
        out.append(f'<line x1="{LEFT - 4}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{p:.2f}</text>')
    for share, label in ((0.001, "0.1%"), (0.01, "1%"), (0.1, "10%"), (1.0, "100%")):
        x = x_of(share)
        anchor = "end" if share == 1.0 else "middle"
        ticks.append(_box(label, x, PLOT_BOTTOM + 19, anchor))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{PLOT_BOTTOM + 4}" stroke="#e3e3e3"/>'
                   f'<text x="{x:.1f}" y="{PLOT_BOTTOM + 19}" text-anchor="{anchor}">{label}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{PLOT_BOTTOM + 35}" text-anchor="middle">share of '
               'recompute\'s tokens computed (log)</text>'
               f'<text transform="translate(12 {(TOP + PLOT_BOTTOM) / 2:.0f}) rotate(-90)" '
               'text-anchor="middle">agreement on changed edits</text>')
    ty = y_of(threshold)
    text = f"threshold {threshold:.2f}"
    tx = W - RIGHT - 4
    out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#2e7d32" '
               f'stroke-width="1.5" stroke-dasharray="6 4" data-threshold="{threshold:.2f}"/>'
               f'<text x="{tx}" y="{ty - 4:.1f}" text-anchor="end" fill="#2e7d32" '
               f'class="label">{text}</text>')
    line = Box(LEFT, ty - 1.5, W - RIGHT, ty + 1.5)  # no label on the threshold's line
    return out, [*ticks, line, _box(text, tx, ty - 4, "end")]


def frontier_svg(view: SweepView) -> str:
    """The frontier of `view` at its threshold (see the module's docstring)."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           'role="img" aria-labelledby="frontier-title" class="frontier" font-family="sans-serif" '
           f'font-size="{FONT}">',
           '<title id="frontier-title">Editing frontier: agreement with recompute on changed edits '
           'against the share of recompute\'s tokens computed, with the policy\'s threshold</title>']
    axes, taken = _axes(view.threshold)
    out += axes
    mine = [p for p in view.frontier if p.source == "this sweep" and p.agreement is not None
            and p.cost_share is not None]
    paper = [p for p in view.frontier if p.source != "this sweep" and p.agreement is not None
             and p.cost_share is not None]
    xs = spread([x_of(p.cost_share) for p in mine])
    points: list[tuple[str, float, float]] = []
    for point, x in zip(mine, xs, strict=True):
        y, name = y_of(point.agreement), escape(point.label)
        if point.ci95:  # a label never sits on a bar
            taken.append(Box(x - 1.5, y_of(point.ci95[1]), x + 1.5, y_of(point.ci95[0])))
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y_of(point.ci95[1]):.1f}" '
                       f'y2="{y_of(point.ci95[0]):.1f}" stroke="{MINE}" stroke-width="2" opacity="0.75" '
                       f'data-interval="{name}"/>')
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{MINE}" data-point="{name}">'
                   f'<title>{name}: {point.agreement:.2f} at {point.cost_share:.1%}</title></circle>')
        points.append((point.label, x, y))
    for point in paper:
        x, y, name = x_of(point.cost_share), y_of(point.agreement), escape(point.label)
        out.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="none" '
                   f'stroke="{PAPER}" stroke-width="1.5"><title>{name} ({escape(point.source)}): '
                   f'{point.agreement:.2f} at {point.cost_share:.1%}</title></rect>')
        points.append((point.label, x, y))
    for label in place_labels(points, taken):
        colour, source = (MINE, "this sweep") if label.index < len(mine) else (PAPER, "paper")
        if label.leader:
            lx, ly = label.leader
            out.append(f'<line x1="{lx:.1f}" y1="{ly:.1f}" x2="{label.x:.1f}" y2="{label.y - 4:.1f}" '
                       f'stroke="{colour}" stroke-width="0.75" opacity="0.6" class="leader"/>')
        out.append(f'<text x="{label.x:.1f}" y="{label.y:.1f}" text-anchor="{label.anchor}" '
                   f'fill="{colour}" class="label" data-source="{source}">{escape(label.text)}</text>')
    ly = PLOT_BOTTOM + 56
    out.append(f'<circle cx="{LEFT + 4}" cy="{ly - 4}" r="4.5" fill="{MINE}"/>'
               f'<text x="{LEFT + 14}" y="{ly}">this sweep ({escape(view.model)})</text>'
               f'<rect x="{LEFT}" y="{ly + 12}" width="8" height="8" fill="none" stroke="{PAPER}"/>'
               f'<text x="{LEFT + 14}" y="{ly + 20}">{escape(view.paper_model)} (8 gated tasks)</text>')
    out.append("</svg>")
    return "".join(out)
