"""How a speed-up reads when it does not stand: one rule for the run page, the presentation cards,
the exports and the command line.

A speed-up (recompute's time to first token over a strategy's) stands when its range over the
paired timing rounds stays on one side of 1× and spans at most a factor of `MAX_RANGE_FACTOR`.
When it does not, the reader is told what happened, with the range:

- "too short to time": recompute's own first token came in under `MIN_TIMED_MS`, the floor below
  which the machine's jitter is as large as what is timed;
- "noisy: 0.9–1.1×, about the same as recompute": the range crosses 1× and is narrow, so the
  strategy is as fast as recompute within the noise;
- "noisy: 0.4–3.6×": the range crosses 1× widely: it cannot say which is faster;
- "at least 4.1×": the range stays above 1× but spans more than a factor of `MAX_RANGE_FACTOR`: the
  strategy was faster in every round, by at least the range's low end (a speed-up, not noise; the
  median is not quoted alone because the rounds disagree on how much); "at most 0.6×" likewise when
  it stays below 1× (slower in every round).

Runs stored before paired rounds have no range: under the floor they are too short to time
whatever else; above it, the range is read from the two time-to-first-token spreads (recompute's
fastest over the strategy's slowest, to its slowest over the strategy's fastest) when stored. With
paired rounds a range that stands stands even under the floor (the rounds pair out the machine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_TIMED_MS = 250.0  # recompute's time to first token under this is too short to time
MAX_RANGE_FACTOR = 2.0  # a range wider than this factor is quoted by its near end (or noisy across 1×)

TOO_SHORT = "too short to time"


@dataclass(frozen=True)
class SpeedupReading:
    """Why a speed-up does not stand as one number: `kind` short | noisy | bound (the range stays on
    one side of 1× but is wide: `label` quotes its near end), the cell's `label`, and the range it
    was read from (None when there was none)."""

    kind: str
    label: str
    low: float | None = None
    high: float | None = None


def _pair(values: Sequence[float] | None) -> tuple[float, float] | None:
    return (float(values[0]), float(values[1])) if values and len(values) == 2 else None


def speedup_reading(ref_ttft_ms: float | None, ttft_ms: float | None,
                    paired_range: Sequence[float] | None = None,
                    ref_spread: Sequence[float] | None = None,
                    spread: Sequence[float] | None = None) -> SpeedupReading | None:
    """None when the speed-up stands (or there is none to judge); else how it reads.

    paired_range: the speed-up's [min, max] over the paired rounds (empty for older runs);
    ref_spread / spread: recompute's and the strategy's [min, max] time to first token."""
    if not ref_ttft_ms or not ttft_ms:
        return None
    span = _pair(paired_range)
    if span is None:  # stored before paired rounds: the floor holds whatever the spreads say
        if ref_ttft_ms < MIN_TIMED_MS:
            return SpeedupReading("short", TOO_SHORT)
        theirs, mine = _pair(ref_spread), _pair(spread)
        if theirs and mine and mine[0] > 0 and mine[1] > 0:
            span = (theirs[0] / mine[1], theirs[1] / mine[0])
    if span is not None and _stands(*span):
        return None
    if ref_ttft_ms < MIN_TIMED_MS:
        return SpeedupReading("short", TOO_SHORT, *(span or (None, None)))
    if span is None:
        return None  # an old run timed above the floor, without spreads: the division stands
    low, high = span
    if low > 1.0:  # faster in every round, by a factor the rounds do not agree on
        return SpeedupReading("bound", f"at least {_factor(low)}×", low, high)
    if 0 < high < 1.0:  # slower in every round
        return SpeedupReading("bound", f"at most {_factor(high)}×", low, high)
    words = f"noisy: {low:.1f}–{high:.1f}×"
    if low <= 1.0 <= high and low > 0 and high / low <= MAX_RANGE_FACTOR:
        words += ", about the same as recompute"
    return SpeedupReading("noisy", words, low, high)


def _factor(x: float) -> str:
    """A bound as it reads: one decimal, two where one would round to 1 ("at least 1.04×", never
    "at least 1.0×", which reads as no speed-up)."""
    return f"{x:.2f}" if f"{x:.1f}" == "1.0" else f"{x:.1f}"


def _stands(low: float, high: float) -> bool:
    return not (low <= 1.0 <= high) and low > 0 and high / low <= MAX_RANGE_FACTOR
