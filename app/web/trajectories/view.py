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
from vocabulary.trajectories import decisive_turns, split_variant

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
           legend_rows: int = 1, unit=lambda v: f"{v:.3g}", decisive: list[int] = ()) -> list[str]:
    height = H + 40 + 16 * max(legend_rows - 1, 0)  # every legend row inside the drawing
    axis = H - PAD + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" role="img" '
             f'aria-label="{escape(title)}" class="trajectory-plot">',
             f'<text x="{PAD}" y="15" font-size="{FONT}">{escape(title)}</text>']
    band = (W - PAD - 20) / max(n - 1, 1) if n > 1 else 24
    for i in decisive:  # the turns the first verdict column counts: recompute's decision moved
        x = _x(i, n)
        parts.append(f'<rect class="decisive-turn" x="{x - band / 2:.1f}" y="24" width="{band:.1f}" '
                     f'height="{axis - 24}" fill="#e6b800" fill-opacity="0.14"><title>turn {i + 1}: '
                     "recompute's decision differs from the document's (stale's)</title></rect>")
    parts += [f'<line x1="{PAD}" y1="{axis}" x2="{W - 10}" y2="{axis}" stroke="#999"/>',
              f'<line x1="{PAD}" y1="24" x2="{PAD}" y2="{axis}" stroke="#999"/>',
              f'<text x="{W // 2}" y="{H + 14}" font-size="{FONT - 2}" text-anchor="middle">turn · '
              f'{escape(y_label)}</text>']
    parts += _y_ticks(top, 24 + 8, axis, unit)
    parts += _turn_ticks(n, axis)
    for i in changed:  # where fields changed
        x = _x(i, n)
        parts.append(f'<line class="field-change" x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{axis}" '
                     'stroke="#c33" stroke-dasharray="2 3"><title>a field changed</title></line>')
    return parts


def _y_ticks(top: float, y_top: float, y_zero: float, unit, count: int = 4, at: float = PAD) -> list[str]:
    """Numbered ticks on a y axis at x `at`: 0, a quarter, a half, … and the top."""
    out = []
    for j in range(count + 1):
        y = y_zero - (y_zero - y_top) * j / count
        out.append(f'<line x1="{at - 3:.1f}" y1="{y:.1f}" x2="{at:.1f}" y2="{y:.1f}" stroke="#999"/>'
                   f'<text class="y-tick" x="{at - 5:.1f}" y="{y + 4:.1f}" font-size="{FONT - 2}" '
                   f'text-anchor="end">{escape(unit(top * j / count) if j else "0")}</text>')
    return out


def _turn_ticks(n: int, axis: float) -> list[str]:
    """The turn axis, numbered, at the x every chart of the page shares (`_x`)."""
    out = []
    for i in _ticks(n):
        x = _x(i, n)
        out.append(f'<line x1="{x:.1f}" y1="{axis}" x2="{x:.1f}" y2="{axis + 4}" stroke="#999"/>'
                   f'<text class="turn-tick" x="{x:.1f}" y="{axis + 16}" font-size="{FONT - 2}" '
                   f'text-anchor="middle">{i + 1}</text>')
    return out


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
    decisive = [i for i, d in enumerate(decisive_turns(turns, judge=False) or []) if d]
    top = max((value(t.results[k]) for t in turns for k in keys if k in t.results), default=0.0) or 1.0
    parts = _frame(title, y_label, top, n, changed, -(-len(keys) // LEGEND_COLUMNS), unit, decisive)
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
    """The turns in order on the x axis the drift and cost charts share (`_x`, numbered ticks):
    recompute's prompt length (a bar, its y axis numbered), where fields changed (a red diamond,
    "label → value"), where a turn asked its own question (?) or placed a skill (S), and per strategy
    that appends errata, the errata its cache holds after each change (an erratum strategy's count
    grows, its one_per_field variant's stays at one per field). Each lane's name sits above it, so
    no name runs into a number."""
    turns, specs = view.turns, view.spec.turns
    n = len(turns)
    if not n:
        return ""
    keys = [k for k in view.strategies if any(t.results.get(k) and t.results[k].errata for t in turns)]
    lane, top, bars_h = 34, 44, 70
    base = top + bars_h
    axis = base + 6
    height = axis + 22 + lane * (1 + len(keys)) + 8
    most = max(t.prompt_tokens for t in turns) or 1
    # narrow bars: turn 1 sits on the shared axis x, half a bar left of it, the y axis just left of that
    width = max(2.0, min(12.0, (W - PAD - 20) / n * 0.4))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" role="img" '
             'aria-label="Timeline of the turns" class="trajectory-plot timeline">',
             f'<text x="{PAD}" y="15" font-size="{FONT}">Timeline: recompute\'s prompt tokens, field changes '
             'and errata per turn</text>',
             f'<line x1="{PAD}" y1="{base}" x2="{W - 10}" y2="{base}" stroke="#999"/>']
    for i, t in enumerate(turns):
        h = bars_h * t.prompt_tokens / most
        parts.append(f'<rect x="{_x(i, n) - width / 2:.1f}" y="{base - h:.1f}" width="{width:.1f}" '
                     f'height="{h:.1f}" fill="#b8c2d6"><title>turn {i + 1}: {t.prompt_tokens} prompt '
                     'tokens</title></rect>')
    parts.append(f'<line x1="{PAD - width / 2 - 2:.1f}" y1="{top - 8}" x2="{PAD - width / 2 - 2:.1f}" '
                 f'y2="{base}" stroke="#999"/>')  # the y axis, left of turn 1's bar
    parts += _y_ticks(float(most), top, base, lambda v: f"{v:.0f}", count=2, at=PAD - width / 2 - 2)
    parts += _turn_ticks(n, base)
    y = axis + 22 + lane * 0.6
    parts.append(f'<text x="4" y="{y - 12:.1f}" font-size="11">fields changed</text>'
                 f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - 10}" y2="{y:.1f}" stroke="#ccc"/>')
    for i, t in enumerate(turns):
        spec = specs[t.index] if t.index < len(specs) else None
        x = _x(i, n)
        if t.changed and spec is not None:
            what = ", ".join(f"{label} → {spec.fields.get(label, '')}" for label in t.changed)
            anchor = "end" if x > W * 0.6 else "start"
            dx = -9 if anchor == "end" else 9
            parts.append(f'<path d="M{x:.1f},{y - 7:.1f} l6,7 l-6,7 l-6,-7 z" fill="#c33">'
                         f'<title>turn {i + 1}: {escape(what)}</title></path>'
                         f'<text x="{x + dx:.1f}" y="{y + 4 - 12 * (i % 2):.1f}" font-size="11" fill="#c33" '
                         f'text-anchor="{anchor}">{escape(what[:32])}</text>')
        marks = ("?" if spec is not None and spec.question is not None else "") + \
                ("S" if spec is not None and getattr(spec, "skill", None) else "")
        if marks:
            parts.append(f'<text x="{x:.1f}" y="{y + 18:.1f}" font-size="11" text-anchor="middle">{marks}'
                         f'<title>turn {i + 1}: {"asks its own question " if "?" in marks else ""}'
                         f'{"places a skill" if "S" in marks else ""}</title></text>')
    for j, k in enumerate(keys):
        y = axis + 22 + lane * (1.6 + j)
        parts.append(f'<text x="4" y="{y - 10:.1f}" font-size="11" fill="{colour(k)}">{escape(k)}: errata '
                     f'in its cache<title>{escape(k)}: errata in its cache after each change</title></text>'
                     f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - 10}" y2="{y:.1f}" stroke="{colour(k)}" '
                     f'stroke-opacity="0.35"{_dash(k)}/>')
        for i, t in enumerate(turns):
            r = t.results.get(k)
            if r is None or not t.changed:
                continue
            x = _x(i, n)
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour(k)}"><title>{escape(k)} '
                         f'after turn {i + 1}: {r.errata} errata in its cache</title></circle>'
                         f'<text x="{x:.1f}" y="{y + 3.5:.1f}" font-size="9" fill="#fff" '
                         f'text-anchor="middle">{r.errata}</text>')
    parts.append("</svg>")
    return "".join(parts)


def decisive_of(view: TrajectoryView) -> set[int]:
    """The turn indices where recompute's decision differs from the document's (stale's): the
    turns the summary's first column counts (a field change need not be one of them)."""
    return {i for i, d in enumerate(decisive_turns(view.turns, judge=False) or []) if d}


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
