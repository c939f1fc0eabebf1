"""What the trajectory page and its offline report draw from the one `TrajectoryView`, on the
server: the drift over turns (KL to recompute per strategy, a disagreement marked with a cross), the
cumulative TTFT per strategy, and the turns' timeline (prompt length, where fields changed and the
errata each strategy's cache holds); and the CSV export, one row per turn and strategy."""

from __future__ import annotations

import csv
import io
from html import escape

from app.services.trajectories import TrajectoryView
from vocabulary import EDIT_INFO
from vocabulary.trajectories import split_variant

W, H, PAD = 640, 220, 52  # PAD: room for the y axis's top value ("40.6 s")
COLUMNS = ("trajectory_id", "turn", "strategy", "decision", "agrees", "edit_followed", "kl_to_recompute",
           "logit_cosine", "tokens_computed", "ttft_ms", "cumulative_ttft_ms", "cache_tokens",
           "cumulative_tokens", "errata", "changed")


def colour(key: str) -> str:
    info = EDIT_INFO.get(split_variant(key)[0])
    return info.colour if info else "#3d4350"


def _dash(key: str) -> str:
    return ' stroke-dasharray="5 3"' if split_variant(key)[1] else ""


LEGEND_COLUMNS = 3  # legend entries per row ("field_erratum.one_per_field" needs a third of the width)


FONT = 13  # the plots' text, in the drawing's units (drawn about 1:1 at the page's width)


def _frame(title: str, y_label: str, top: float, n: int, changed: list[int],
           legend_rows: int = 1, unit=lambda v: f"{v:.3g}") -> list[str]:
    height = H + 40 + 16 * max(legend_rows - 1, 0)  # every legend row inside the drawing
    axis = H - PAD + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" role="img" '
             f'aria-label="{escape(title)}" class="trajectory-plot">',
             f'<text x="{PAD}" y="15" font-size="{FONT}">{escape(title)}</text>',
             f'<line x1="{PAD}" y1="{axis}" x2="{W - 10}" y2="{axis}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="24" x2="{PAD}" y2="{axis}" stroke="#999"/>',
             f'<text x="{PAD - 4}" y="32" font-size="{FONT - 2}" '
             f'text-anchor="end">{escape(unit(top))}</text>',
             f'<text x="{PAD - 4}" y="{axis}" font-size="{FONT - 2}" text-anchor="end">0</text>',
             f'<text x="{W // 2}" y="{H + 14}" font-size="{FONT - 2}" text-anchor="middle">turn · '
             f'{escape(y_label)}</text>']
    for i in _ticks(n):  # the turn axis, numbered
        x = _x(i, n)
        parts.append(f'<line x1="{x:.1f}" y1="{axis}" x2="{x:.1f}" y2="{axis + 4}" stroke="#999"/>'
                     f'<text class="turn-tick" x="{x:.1f}" y="{axis + 16}" font-size="{FONT - 2}" '
                     f'text-anchor="middle">{i + 1}</text>')
    for i in changed:  # where fields changed
        x = _x(i, n)
        parts.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{axis}" stroke="#c33" '
                     'stroke-dasharray="2 3"><title>fields changed</title></line>')
    return parts


def _ticks(n: int, most: int = 12) -> list[int]:
    """The turn indices numbered on the axis: every one up to `most`, else every k-th and the last."""
    step = max(1, -(-n // most))
    return sorted({*range(0, n, step), n - 1}) if n else []


def seconds(ms: float) -> str:
    """A time in seconds for an axis: "40.6 s", "0.35 s"."""
    return f"{ms / 1000:.3g} s"


def _x(i: int, n: int) -> float:
    return PAD + (W - PAD - 20) * (i / max(n - 1, 1))


def _y(v: float, top: float) -> float:
    return (H - PAD + 20) - (H - PAD - 4) * (v / top if top > 0 else 0)


def _legend(keys: list[str]) -> str:
    step = (W - PAD) // LEGEND_COLUMNS
    return "".join(f'<text x="{PAD + step * (j % LEGEND_COLUMNS)}" y="{H + 34 + 16 * (j // LEGEND_COLUMNS)}" '
                   f'font-size="{FONT - 1}" class="plot-legend" '
                   f'fill="{colour(k)}">■ {escape(k)}</text>' for j, k in enumerate(keys))


def _plot(view: TrajectoryView, value, title: str, y_label: str, crosses: bool,
          unit=lambda v: f"{v:.3g}") -> str:
    turns, keys = view.turns, list(view.strategies)
    n = len(turns)
    if not n:
        return ""
    changed = [t.index for t in turns if t.changed]
    top = max((value(t.results[k]) for t in turns for k in keys if k in t.results), default=0.0) or 1.0
    parts = _frame(title, y_label, top, n, changed, -(-len(keys) // LEGEND_COLUMNS), unit)
    for k in keys:
        points = [(_x(i, n), _y(value(t.results[k]), top)) for i, t in enumerate(turns) if k in t.results]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline fill="none" stroke="{colour(k)}" stroke-width="1.6"{_dash(k)} '
                     f'points="{path}"><title>{escape(k)}</title></polyline>')
        if crosses:
            for i, t in enumerate(turns):
                r = t.results.get(k)
                if r is not None and not r.agrees:
                    x, y = _x(i, n), _y(value(r), top)
                    parts.append(f'<text x="{x - 3:.1f}" y="{y + 4:.1f}" font-size="11" fill="{colour(k)}">×'
                                 f'<title>{escape(k)} disagreed at turn {i + 1}</title></text>')
    parts.append(_legend(keys))
    parts.append("</svg>")
    return "".join(parts)


def drift_svg(view: TrajectoryView) -> str:
    """KL to recompute per turn and strategy (× where the decision disagreed)."""
    return _plot(view, lambda r: r.kl_to_recompute, "Drift: KL to recompute at each turn (× = disagreed)",
                 "KL", crosses=True)


def cumulative_svg(view: TrajectoryView) -> str:
    """Cumulative time to first token per strategy over the turns."""
    return _plot(view, lambda r: r.cumulative_ttft_ms, "Cumulative TTFT per strategy (seconds)", "seconds",
                 crosses=False, unit=seconds)


def timeline_svg(view: TrajectoryView) -> str:
    """The turns in order, one column each: recompute's prompt length (a bar), where fields changed
    (a red diamond, "label → value"), where a turn asked its own question (?) or placed a skill (S),
    and per strategy that appends errata, the errata its cache holds after each change (an erratum
    strategy's count grows, its one_per_field variant's stays at one per field)."""
    turns, specs = view.turns, view.spec.turns
    n = len(turns)
    if not n:
        return ""
    keys = [k for k in view.strategies if any(t.results.get(k) and t.results[k].errata for t in turns)]
    left, right, lane, top, bars_h = 110, 16, 24, 40, 60

    def x(i: int) -> float:  # the middle of turn i's column
        return left + (W - left - right) * (i + 0.5) / n

    base = top + bars_h
    height = base + lane * (2 + len(keys)) + 4
    most = max(t.prompt_tokens for t in turns) or 1
    width = max(2.0, min(24.0, (W - left - right) / n * 0.6))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" role="img" '
             'aria-label="Timeline of the turns" class="trajectory-plot">',
             f'<text x="{PAD}" y="14" font-size="12">Timeline: prompt length, field changes and errata per '
             'turn</text>',
             f'<text x="4" y="{top + 4}" font-size="11">prompt tokens</text>'
             f'<text x="4" y="{top + 16}" font-size="11" fill="#666">(recompute\'s)</text>'
             f'<text x="{left - 6}" y="{top + 4}" font-size="11" text-anchor="end">{most}</text>'
             f'<text x="{left - 6}" y="{base}" font-size="11" text-anchor="end">0</text>']
    for i, t in enumerate(turns):
        h = bars_h * t.prompt_tokens / most
        parts.append(f'<rect x="{x(i) - width / 2:.1f}" y="{base - h:.1f}" width="{width:.1f}" '
                     f'height="{h:.1f}" fill="#b8c2d6"><title>turn {i + 1}: {t.prompt_tokens} prompt '
                     'tokens</title></rect>')
    y = base + lane
    parts.append(f'<text x="4" y="{y + 4}" font-size="11">turns (1..{n})</text>'
                 f'<line x1="{left}" y1="{y}" x2="{W - right}" y2="{y}" stroke="#ccc"/>')
    for i, t in enumerate(turns):
        spec = specs[t.index] if t.index < len(specs) else None
        parts.append(f'<line x1="{x(i):.1f}" y1="{y - 3}" x2="{x(i):.1f}" y2="{y + 3}" stroke="#999"/>')
        if t.changed and spec is not None:
            what = ", ".join(f"{label} → {spec.fields.get(label, '')}" for label in t.changed)
            anchor = "end" if x(i) > W * 0.6 else "start"
            dx = -9 if anchor == "end" else 9
            parts.append(f'<path d="M{x(i):.1f},{y - 7} l6,7 l-6,7 l-6,-7 z" fill="#c33">'
                         f'<title>turn {i + 1}: {escape(what)}</title></path>'
                         f'<text x="{x(i) + dx:.1f}" y="{y + 4 - 12 * (i % 2)}" font-size="11" fill="#c33" '
                         f'text-anchor="{anchor}">{escape(what[:32])}</text>')
        marks = ("?" if spec is not None and spec.question is not None else "") + \
                ("S" if spec is not None and getattr(spec, "skill", None) else "")
        if marks:
            parts.append(f'<text x="{x(i):.1f}" y="{y + 16}" font-size="11" text-anchor="middle">{marks}'
                         f'<title>turn {i + 1}: {"asks its own question " if "?" in marks else ""}'
                         f'{"places a skill" if "S" in marks else ""}</title></text>')
    for j, k in enumerate(keys):
        y = base + lane * (2 + j)
        parts.append(f'<text x="4" y="{y + 4}" font-size="11" fill="{colour(k)}">{escape(k[:20])}'
                     f'<title>{escape(k)}: errata in its cache after each change</title></text>'
                     f'<line x1="{left}" y1="{y}" x2="{W - right}" y2="{y}" stroke="{colour(k)}" '
                     f'stroke-opacity="0.35"{_dash(k)}/>')
        for i, t in enumerate(turns):
            r = t.results.get(k)
            if r is None or not t.changed:
                continue
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y}" r="7" fill="{colour(k)}"><title>{escape(k)} '
                         f'after turn {i + 1}: {r.errata} errata in its cache</title></circle>'
                         f'<text x="{x(i):.1f}" y="{y + 3.5}" font-size="9" fill="#fff" text-anchor="middle">'
                         f'{r.errata}</text>')
    parts.append("</svg>")
    return "".join(parts)


def set_back(view: TrajectoryView) -> dict[int, list[str]]:
    """{turn index: labels} of the turns that set a field back to the document's own value: their
    answers have no new value to follow, so their "edit followed" cell says why it is empty."""
    original = {f.label: view.spec.document[f.start:f.end] for f in view.spec.fields}
    out: dict[int, list[str]] = {}
    for i, spec in enumerate(view.spec.turns):
        labels = [label for label, value in spec.fields.items() if value and value == original.get(label)]
        if labels:
            out[i] = labels
    return out


def csv_text(view: TrajectoryView) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for t in view.turns:
        for k, r in t.results.items():
            writer.writerow([view.id, t.index + 1, k, r.decision, r.agrees, r.edit_followed or "",
                             f"{r.kl_to_recompute:.6g}", f"{r.logit_cosine:.6f}", r.tokens_computed,
                             f"{r.ttft_ms:.2f}", f"{r.cumulative_ttft_ms:.2f}", r.cache_tokens,
                             r.cumulative_tokens, r.errata, " ".join(t.changed)])
    return out.getvalue()
