"""What the trajectory page's "Replay on vLLM" panel shows of a trajectory replay: per variant the
hit rate over the turns, /metrics' and the cumulative TTFT; one row per turn with every variant's
hit rate, cached / prompt tokens, TTFT and answer; the hit rate per turn and the cumulative TTFT
drawn on the server (one line per variant, the turns where fields changed marked); and the CSV
export, one line per variant and turn."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from html import escape

from data.replays import Replay
from vocabulary import EDIT_INFO
from vocabulary.replay import (
    TRAJECTORY_VARIANT_HELP,
    TURN_REPORTED,
    TrajectoryReplayResult,
    TrajectoryReplaySpec,
    TurnHit,
)

W, H, PAD = 640, 200, 44
CSV_COLUMNS = ("variant", "turn", "changed", "prompt_tokens", "cached_tokens", "hit_rate", "estimated_share",
               "ttft_ms", "cumulative_ttft_ms", "errata", "answer", "edit_followed")


@dataclass(frozen=True)
class TurnRow:
    """One turn: its number (from 1), the fields it changed (label → value) and each variant's turn."""

    number: int
    changed: dict[str, str]
    hits: dict[str, TurnHit]


def colour(variant: str) -> str:
    info = EDIT_INFO.get(variant)
    return info.colour if info else "#3d4350"


def turn_rows(spec: TrajectoryReplaySpec, result: TrajectoryReplayResult) -> list[TurnRow]:
    """One row per turn, every variant's numbers side by side."""
    n = min((len(v.turns) for v in result.variants.values()), default=0)
    rows = []
    for i in range(n):
        hits = {name: v.turns[i] for name, v in result.variants.items()}
        labels = next(iter(hits.values())).changed
        turn = spec.turns[i] if i < len(spec.turns) else None
        changed = {label: (turn.fields.get(label, "") if turn else "") for label in labels}
        rows.append(TurnRow(i + 1, changed, hits))
    return rows


def _x(i: int, n: int) -> float:
    return PAD + (W - PAD - 16) * (i / max(n - 1, 1))


def _y(value: float, top: float) -> float:
    return 24 + (H - 24 - 30) * (1 - (value / top if top > 0 else 0))


def _plot(result: TrajectoryReplayResult, value, title: str, top: float, tick: str) -> str:
    """One line per variant over the turns; red dashed verticals where fields changed."""
    variants = result.variants
    n = min((len(v.turns) for v in variants.values()), default=0)
    if not n:
        return ""
    floor = _y(0, top)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H + 20}" role="img" '
             f'aria-label="{escape(title)}" class="trajectory-plot">',
             f'<text x="{PAD}" y="14" font-size="12">{escape(title)}</text>',
             f'<line x1="{PAD}" y1="{floor:.1f}" x2="{W - 10}" y2="{floor:.1f}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="24" x2="{PAD}" y2="{floor:.1f}" stroke="#999"/>',
             f'<text x="4" y="28" font-size="10">{escape(tick)}</text>',
             f'<text x="4" y="{floor:.1f}" font-size="10">0</text>',
             f'<text x="{W // 2 - 30}" y="{H - 4}" font-size="10">turn 1 … {n}</text>']
    first = next(iter(variants.values())).turns
    for i, t in enumerate(first[:n]):
        if t.changed:
            x = _x(i, n)
            parts.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{floor:.1f}" stroke="#c33" '
                         f'stroke-dasharray="2 3"><title>turn {i + 1} changed {escape(", ".join(t.changed))}'
                         '</title></line>')
    for j, (name, v) in enumerate(variants.items()):
        points = [(_x(i, n), _y(value(t), top)) for i, t in enumerate(v.turns[:n])]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline fill="none" stroke="{colour(name)}" stroke-width="1.6" points="{path}">'
                     f'<title>{escape(name)}</title></polyline>')
        for (x, y), t in zip(points, v.turns):
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour(name)}" '
                         f'data-variant="{escape(name)}" data-turn="{t.index + 1}">'
                         f'<title>{escape(name)}, turn {t.index + 1}: '
                         f'{t.hit_rate * 100:.0f}% of {t.prompt_tokens} prompt tokens cached, TTFT '
                         f'{t.ttft_ms:.0f} ms</title></circle>')
        parts.append(f'<text x="{PAD + 130 * j}" y="{H + 14}" font-size="10" fill="{colour(name)}">'
                     f'■ {escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def hit_rate_svg(result: TrajectoryReplayResult) -> str:
    """The hit rate of every turn, per variant (0 to 100%)."""
    return _plot(result, lambda t: t.hit_rate, "Prefix-cache hit rate per turn", 1.0, "100%")


def cumulative_svg(result: TrajectoryReplayResult) -> str:
    """The cumulative TTFT over the turns, per variant."""
    top = max((v.cumulative_ttft_ms for v in result.variants.values()), default=0.0) or 1.0
    return _plot(result, lambda t: t.cumulative_ttft_ms, "Cumulative TTFT per variant", top,
                 f"{top / 1000:.1f} s" if top >= 1000 else f"{top:.0f} ms")


def trajectory_replay_context(replay: Replay | None) -> dict:
    """The template's values for one trajectory replay (or none yet)."""
    common = {"replay": replay, "turn_reported": TURN_REPORTED, "variant_help": TRAJECTORY_VARIANT_HELP,
              "turn_rows": [], "hit_svg": "", "cumulative_svg": ""}
    result = replay.result if replay is not None else None
    if not isinstance(result, TrajectoryReplayResult) or replay is None \
            or not isinstance(replay.snapshot, TrajectoryReplaySpec):
        return common
    return {**common, "turn_rows": turn_rows(replay.snapshot, result), "hit_svg": hit_rate_svg(result),
            "cumulative_svg": cumulative_svg(result)}


def trajectory_replay_csv(replay: Replay) -> str:
    """One line per variant and turn."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    result = replay.result
    for name, v in (result.variants.items() if isinstance(result, TrajectoryReplayResult) else []):
        for t in v.turns:
            writer.writerow([name, t.index + 1, " ".join(t.changed), t.prompt_tokens, t.cached_tokens,
                             t.hit_rate, t.estimated_share, t.ttft_ms, t.cumulative_ttft_ms, t.errata,
                             t.answer, t.edit_followed or ""])
    return out.getvalue()
