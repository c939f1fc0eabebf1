"""What the trajectory page draws from the one `TrajectoryView`, on the server: the drift over turns
(KL to recompute per strategy, a disagreement marked with a cross), the cumulative TTFT per strategy,
and the turns' timeline (where fields changed); and the CSV export, one row per turn and strategy."""

from __future__ import annotations

import csv
import io
from html import escape

from app.services.trajectories import TrajectoryView
from vocabulary import EDIT_INFO
from vocabulary.trajectories import split_variant

W, H, PAD = 640, 220, 40
COLUMNS = ("trajectory_id", "turn", "strategy", "decision", "agrees", "edit_followed", "kl_to_recompute",
           "logit_cosine", "tokens_computed", "ttft_ms", "cumulative_ttft_ms", "cache_tokens",
           "cumulative_tokens", "errata", "changed")


def colour(key: str) -> str:
    info = EDIT_INFO.get(split_variant(key)[0])
    return info.colour if info else "#3d4350"


def _dash(key: str) -> str:
    return ' stroke-dasharray="5 3"' if split_variant(key)[1] else ""


def _frame(title: str, y_label: str, top: float, n: int, changed: list[int]) -> list[str]:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H + 30}" role="img" '
             f'aria-label="{escape(title)}" class="trajectory-plot">',
             f'<text x="{PAD}" y="14" font-size="12">{escape(title)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD + 20}" x2="{W - 10}" y2="{H - PAD + 20}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="24" x2="{PAD}" y2="{H - PAD + 20}" stroke="#999"/>',
             f'<text x="4" y="30" font-size="10">{top:.3g}</text>',
             f'<text x="4" y="{H - PAD + 20}" font-size="10">0</text>',
             f'<text x="{W // 2}" y="{H + 10}" font-size="10">turn (1..{n}) · {escape(y_label)}</text>']
    for i in changed:  # where fields changed
        x = _x(i, n)
        parts.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{H - PAD + 20}" stroke="#c33" '
                     'stroke-dasharray="2 3"><title>fields changed</title></line>')
    return parts


def _x(i: int, n: int) -> float:
    return PAD + (W - PAD - 20) * (i / max(n - 1, 1))


def _y(v: float, top: float) -> float:
    return (H - PAD + 20) - (H - PAD - 4) * (v / top if top > 0 else 0)


def _legend(keys: list[str]) -> str:
    return "".join(f'<text x="{PAD + 150 * (j % 4)}" y="{H + 24 + 12 * (j // 4)}" font-size="10" '
                   f'fill="{colour(k)}">■ {escape(k)}</text>' for j, k in enumerate(keys))


def _plot(view: TrajectoryView, value, title: str, y_label: str, crosses: bool) -> str:
    turns, keys = view.turns, list(view.strategies)
    n = len(turns)
    if not n:
        return ""
    changed = [t.index for t in turns if t.changed]
    top = max((value(t.results[k]) for t in turns for k in keys if k in t.results), default=0.0) or 1.0
    parts = _frame(title, y_label, top, n, changed)
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
    return _plot(view, lambda r: r.cumulative_ttft_ms, "Cumulative TTFT per strategy (ms)", "ms",
                 crosses=False)


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
