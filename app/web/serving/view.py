"""What the Serving panel shows of a replay: one row per variant (the measured numbers beside
kvnotes's own `prefix_cache_share` estimate for the same edit), each variant's TTFT distribution
as a strip on one log-scaled axis shared by all variants, the hit rate request by request, and the
replay's CSV export (one line per request).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from data.replays import Replay
from vocabulary.replay import REPORTED, VARIANT_HELP, ReplayResult, VariantResult

STRIP_WIDTH = 560  # px of the TTFT axis


@dataclass(frozen=True)
class Dot:
    """One request on a variant's TTFT strip: where (px), its TTFT, its hit rate and its answer."""

    x: float
    ttft_ms: float
    hit_rate: float
    value: str
    answer: str


@dataclass(frozen=True)
class VariantRow:
    name: str
    help: str
    result: VariantResult
    dots: list[Dot]
    p50_x: float
    p90_x: float


@dataclass(frozen=True)
class Axis:
    """The shared log axis: its ticks as (px, label)."""

    ticks: list[tuple[float, str]]


def _scale(low: float, high: float):
    """Whole decades from below `low` to above `high`, and ms → px on them."""
    lo = math.floor(math.log10(max(low, 1.0)))
    hi = max(lo + 1, math.ceil(math.log10(max(high, 1.0))))
    return lo, hi, lambda ms: round((math.log10(max(ms, 1.0)) - lo) / (hi - lo) * STRIP_WIDTH, 1)


def variant_rows(result: ReplayResult) -> tuple[list[VariantRow], Axis]:
    """The table's rows and the TTFT strips' shared axis."""
    every = [t for v in result.variants.values() for t in v.ttft_ms] or [1.0]
    lo, hi, x = _scale(min(every), max(every))
    rows = []
    for name, v in result.variants.items():
        dots = [Dot(x(t), t, h, value, answer)
                for t, h, value, answer in zip(v.ttft_ms, v.hit_rates, v.values, v.answers)]
        rows.append(VariantRow(name, VARIANT_HELP.get(name, ""), v, dots, x(v.ttft_p50_ms), x(v.ttft_p90_ms)))
    ticks = [(x(10.0**k), _ms_label(10.0**k)) for k in range(lo, hi + 1)]
    return rows, Axis(ticks)


def _ms_label(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def panel_context(replay: Replay | None) -> dict:
    """The template's values for one replay (or none yet)."""
    if replay is None or replay.result is None:
        return {"replay": replay, "rows": [], "axis": None, "reported": REPORTED, "strip_width": STRIP_WIDTH,
                "variant_help": VARIANT_HELP}
    rows, axis = variant_rows(replay.result)
    return {"replay": replay, "rows": rows, "axis": axis, "reported": REPORTED, "strip_width": STRIP_WIDTH,
            "variant_help": VARIANT_HELP}


def replay_csv(replay: Replay) -> str:
    """One line per request: variant, request, value, TTFT, prompt-cache hit rate, answer."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["variant", "request", "value", "ttft_ms", "hit_rate", "answer"])
    for name, v in (replay.result.variants.items() if replay.result else []):
        for i, (t, h, value, answer) in enumerate(zip(v.ttft_ms, v.hit_rates, v.values, v.answers), 1):
            writer.writerow([name, i, value, t, h, answer])
    return out.getvalue()
