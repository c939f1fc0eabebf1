"""What the Serving panel shows of a replay: one row per variant (the measured numbers beside
kvnotes's own `prefix_cache_share` estimate for the same edit: the replay's, from the prompts
it sent, and the notebook's latest run's, for the strategy of the variant's name), each variant's
TTFT distribution as a strip on one log-scaled axis shared by all variants, the hit rate request
by request, and the replay's CSV export (one line per request).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from data.models import Run, RunResult, RunStatus
from data.replays import Replay
from vocabulary.replay import REPORTED, VARIANT_HELP, VARIANTS, ReplayResult, VariantResult

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


@dataclass(frozen=True)
class RunEstimates:
    """A run's `prefix_cache_share` per replay variant (the strategy of the same name; None where
    the run did not run it): the share of the prompt that strategy sends that an exact-prefix cache
    already holds from the original prompt."""

    run_id: int
    shares: dict[str, float | None]


def run_estimates(session: Session, notebook_id: int | None) -> RunEstimates | None:
    """The newest succeeded run of the notebook that ran one of the variants' strategies, with its
    `prefix_cache_share` for each (None: no such run)."""
    if notebook_id is None:
        return None
    run_id = session.scalar(
        select(Run.id).join(RunResult, RunResult.run_id == Run.id)
        .where(Run.notebook_id == notebook_id, Run.status == RunStatus.SUCCEEDED.value,
               RunResult.strategy.in_(VARIANTS))
        .order_by(Run.id.desc()).limit(1))
    if run_id is None:
        return None
    found = dict(session.execute(select(RunResult.strategy, RunResult.prefix_cache_share)
                                 .where(RunResult.run_id == run_id, RunResult.strategy.in_(VARIANTS))).all())
    return RunEstimates(run_id, {name: (float(found[name]) if name in found else None) for name in VARIANTS})


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


def panel_context(replay: Replay | None, estimates: RunEstimates | None = None) -> dict:
    """The template's values for one replay (or none yet), with the notebook's run's estimates."""
    common = {"replay": replay, "reported": REPORTED, "strip_width": STRIP_WIDTH,
              "variant_help": VARIANT_HELP, "run_estimates": estimates}
    if replay is None or replay.result is None:
        return {**common, "rows": [], "axis": None}
    rows, axis = variant_rows(replay.result)
    return {**common, "rows": rows, "axis": axis}


def replay_csv(replay: Replay) -> str:
    """One line per request: variant, request, value, TTFT, prompt-cache hit rate, answer."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["variant", "request", "value", "ttft_ms", "hit_rate", "answer"])
    for name, v in (replay.result.variants.items() if replay.result else []):
        for i, (t, h, value, answer) in enumerate(zip(v.ttft_ms, v.hit_rates, v.values, v.answers), 1):
            writer.writerow([name, i, value, t, h, answer])
    return out.getvalue()
