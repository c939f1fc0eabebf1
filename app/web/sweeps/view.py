"""What the sweep page draws from the one `SweepView`: the frontier as a server-drawn SVG
(changed-edit agreement with its interval against cost share, the paper's 8B points beside it),
and the CSV export (one row per edit and strategy)."""

from __future__ import annotations

import csv
import io
import json
import math
from html import escape

from app.services.sweep_view import SweepView

W, H = 700, 340
LEFT, RIGHT, TOP, BOTTOM = 56, 210, 16, 44
X_MIN = 1e-3  # cost share on a log axis: 0.1% .. 100%


def _x(share: float) -> float:
    share = min(1.0, max(X_MIN, share))
    return LEFT + (math.log10(share) - math.log10(X_MIN)) / -math.log10(X_MIN) * (W - LEFT - RIGHT)


def _y(p: float) -> float:
    return TOP + (1 - p) * (H - TOP - BOTTOM)


def frontier_svg(view: SweepView) -> str:
    """The frontier: one filled point per strategy of this sweep (changed-edit agreement, its 95%
    interval as a bar) and one hollow square per point of the paper's 8B model."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           'role="img" aria-labelledby="frontier-title" class="frontier" font-family="sans-serif" '
           'font-size="11">',
           '<title id="frontier-title">Editing frontier: agreement with recompute on changed edits '
           'against the share of recompute\'s tokens computed</title>',
           f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
           'fill="none" stroke="#999"/>']
    for p in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = _y(p)
        out.append(f'<line x1="{LEFT - 4}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{p:.2f}</text>')
    for share, label in ((0.001, "0.1%"), (0.01, "1%"), (0.1, "10%"), (1.0, "100%")):
        x = _x(share)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM + 4}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" text-anchor="middle">share of '
               'recompute\'s tokens computed (log)</text>'
               f'<text transform="translate(14 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
               'text-anchor="middle">agreement on changed edits</text>')
    paper_n = 0
    for point in view.frontier:
        if point.agreement is None or point.cost_share is None:
            continue
        x, y = _x(point.cost_share), _y(point.agreement)
        name = escape(point.label)
        if point.source == "this sweep":
            if point.ci95:
                out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_y(point.ci95[1]):.1f}" '
                           f'y2="{_y(point.ci95[0]):.1f}" stroke="#1f5fa8" stroke-width="2"/>')
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="#1f5fa8">'
                       f'<title>{name}: {point.agreement:.2f} at {point.cost_share:.1%}</title></circle>'
                       f'<text x="{x + 7:.1f}" y="{y - 5:.1f}" fill="#1f5fa8">{name}</text>')
        else:
            paper_n += 1
            dy = 12 + 11 * (paper_n % 3)  # the paper's points crowd near 12%: stagger their labels
            out.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="none" '
                       f'stroke="#b4580a" stroke-width="1.5"><title>{name} ({escape(point.source)}): '
                       f'{point.agreement:.2f} at {point.cost_share:.1%}</title></rect>'
                       f'<text x="{x + 7:.1f}" y="{y + dy:.1f}" fill="#b4580a">{name}</text>')
    lx = W - RIGHT + 80  # right of the 100% column's labels
    out.append(f'<circle cx="{lx}" cy="{TOP + 10}" r="4.5" fill="#1f5fa8"/>'
               f'<text x="{lx + 8}" y="{TOP + 14}">this sweep</text>'
               f'<text x="{lx + 8}" y="{TOP + 27}">({escape(view.model)})</text>'
               f'<rect x="{lx - 4}" y="{TOP + 40}" width="8" height="8" fill="none" stroke="#b4580a"/>'
               f'<text x="{lx + 8}" y="{TOP + 48}">{escape(view.paper_model)}</text>'
               f'<text x="{lx + 8}" y="{TOP + 61}">(8 gated tasks)</text>')
    out.append("</svg>")
    return "".join(out)


CSV_COLUMNS = ("sweep_id", "position", "run_id", "status", "field", "values", "expected", "strategy",
               "decision", "edit_followed", "agrees_with_recompute", "changed", "kl_to_recompute",
               "tokens_computed", "ttft_ms", "prefix_cache_share", "attempts")


def csv_text(view: SweepView) -> str:
    """One row per edit and strategy, with a header; an edit without results has one row per
    strategy asked, its status saying why it has none."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for edit in view.edits:
        for name in view.strategies:
            r = edit.results.get(name)
            writer.writerow([view.id, edit.position, edit.run_id, edit.status, edit.field,
                             json.dumps(edit.values, ensure_ascii=False), edit.expected or "", name,
                             r.decision if r else "", (r.edit_followed or "") if r else "",
                             "" if r is None or r.agrees is None else int(r.agrees),
                             "" if edit.changed is None else int(edit.changed),
                             r.kl_to_recompute if r else "", r.tokens_computed if r else "",
                             r.ttft_ms if r else "", r.prefix_cache_share if r else "", edit.attempts])
    return buffer.getvalue()
