"""A sweep's counting, per strategy over its finished edits: what is compared on an edit (its
decision key), whether recompute's decision changed there, and each strategy's agreement with
recompute on every determined edit and on the changed edits (`Share`: k of n with its 95%
confidence sequence, `vocabulary.confidence`), its flips, accuracy, KL, cost share and speed-up.
Pure stdlib; `vocabulary.sweeps` holds the definitions and re-exports these names.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from vocabulary.agreement import decision_key as agreement_key
from vocabulary.confidence import confidence_sequence
from vocabulary.strategies import EDIT_INFO, FLOOR, REFERENCE
from vocabulary.verdicts import words

ORIGINAL = FLOOR  # whose decision is the original document's
DETERMINED = ("new", "old")
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of k successes in n trials (None when n is 0): valid for a sample
    of fixed size looked at once (a trajectory's turns); a sweep uses `confidence_sequence`."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Share:
    """k of n, its value (None when n is 0) and its 95% confidence sequence's interval."""

    k: int
    n: int

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def ci95(self) -> tuple[float, float] | None:
        return confidence_sequence(self.k, self.n)

    @property
    def lower(self) -> float:
        ci = self.ci95
        return ci[0] if ci else 0.0

    @property
    def upper(self) -> float:
        ci = self.ci95
        return ci[1] if ci else 1.0

    def words(self) -> str:
        ci = self.ci95
        return f"{self.k} of {self.n}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


@dataclass(frozen=True)
class Outcome:
    """One strategy on one edit, as stored: its decision, verdict, KL, cost and time."""

    decision: str
    followed: str | None
    kl: float
    tokens: int
    prefix_cache_share: float
    ttft_ms: float
    speedup: float | None = None  # the engine's paired speed-up over recompute, when it measured one


@dataclass(frozen=True)
class EditRecord:
    """One finished edit: its position, the field group it belongs to ("" when the edits set
    several fields together), the values it set, the expected answer, and every strategy's outcome
    (recompute's and stale's included)."""

    position: int
    group: str
    values: dict[str, str]
    expected: str | None
    run_id: int
    outcomes: dict[str, Outcome]


def decision_key(outcome: Outcome, choices: bool) -> str | None:
    """What is compared, under the one agreement rule (`vocabulary.agreement.decision_key`): the
    choice, or the free answer's verdict (None when it names no side)."""
    return agreement_key(outcome.decision, outcome.followed, choices)


def matches_expected(answer: str, expected: str, choices: bool) -> bool:
    """The answer is the expected one: the same choice, or a free answer naming it as a phrase."""
    if choices:
        return answer.strip().lower() == expected.strip().lower()
    said, want = words(answer), words(expected)
    return bool(want) and any(said[i:i + len(want)] == want for i in range(len(said) - len(want) + 1))


def changed(edit: EditRecord, choices: bool) -> bool | None:
    """Did recompute's decision move from the original document's? None when undetermined."""
    ref, orig = edit.outcomes.get(REFERENCE), edit.outcomes.get(ORIGINAL)
    if ref is None or orig is None:
        return None
    ref_key = decision_key(ref, choices)
    if ref_key is None:
        return None
    return ref_key != (decision_key(orig, choices) if choices else orig.followed)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _quartiles(values: Sequence[float]) -> tuple[float, float] | None:
    if len(values) < 2:
        return (values[0], values[0]) if values else None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


@dataclass(frozen=True)
class StrategyStats:
    """One strategy over a sweep's edits."""

    name: str
    edits: int
    agreement: Share
    changed: Share
    undetermined: int
    accuracy: Share | None
    kl_median: float | None
    cost_share: float | None
    prefix_cache_share: float | None
    speedup_median: float | None
    speedup_iqr: tuple[float, float] | None
    exact: bool

    @property
    def misses(self) -> int:
        """Changed edits on which it kept another decision than recompute's new one."""
        return self.changed.n - self.changed.k

    @property
    def flips(self) -> int:
        """Edits where recompute kept the original decision and this strategy moved off it."""
        return self.agreement.n - self.agreement.k - self.misses

    @property
    def role(self) -> str:
        info = EDIT_INFO.get(self.name)
        return info.role if info else "candidate"


def strategy_stats(name: str, edits: Sequence[EditRecord], choices: bool) -> StrategyStats:
    agree = Share(0, 0)
    moved = Share(0, 0)
    undetermined = 0
    correct, scored = 0, 0
    kls, shares, speedups = [], [], []
    tokens = ref_tokens = 0
    n = 0
    for edit in edits:
        mine, ref = edit.outcomes.get(name), edit.outcomes.get(REFERENCE)
        if mine is None or ref is None:
            continue
        n += 1
        ref_key = decision_key(ref, choices)
        if ref_key is None:
            undetermined += 1
        else:
            same = decision_key(mine, choices) == ref_key
            agree = Share(agree.k + same, agree.n + 1)
            if changed(edit, choices):
                moved = Share(moved.k + same, moved.n + 1)
        if edit.expected:
            scored += 1
            correct += matches_expected(mine.decision, edit.expected, choices)
        kls.append(mine.kl)
        shares.append(mine.prefix_cache_share)
        tokens, ref_tokens = tokens + mine.tokens, ref_tokens + ref.tokens
        if mine.speedup is not None and mine.speedup > 0:  # median of the engine's paired rounds
            speedups.append(mine.speedup)
        elif mine.ttft_ms > 0 and ref.ttft_ms > 0:
            speedups.append(ref.ttft_ms / mine.ttft_ms)
    return StrategyStats(
        name=name, edits=n, agreement=agree, changed=moved, undetermined=undetermined,
        accuracy=Share(correct, scored) if scored else None, kl_median=_median(kls),
        cost_share=tokens / ref_tokens if ref_tokens else None, prefix_cache_share=_median(shares),
        speedup_median=_median(speedups), speedup_iqr=_quartiles(speedups),
        exact=name in EDIT_INFO and EDIT_INFO[name].exact,
    )


def share_dict(share: Share) -> dict:
    ci = share.ci95
    return {"value": share.value, "ci95": list(ci) if ci else None, "agreed": share.k, "edits": share.n}


def strategy_dict(s: StrategyStats) -> dict:
    """One strategy's statistics in the shape `GET /api/sweeps/{id}` and `kvnotes sweep --json`
    give them (`agreement`, `agreement_ci95`, the counts, `changed`, `accuracy`, …)."""
    ci = s.agreement.ci95
    return {"agreement": s.agreement.value, "agreement_ci95": list(ci) if ci else None,
            "agreed": s.agreement.k, "determined": s.agreement.n, "undetermined": s.undetermined,
            "changed": share_dict(s.changed), "accuracy": share_dict(s.accuracy) if s.accuracy else None,
            "kl_median": s.kl_median, "cost_share": s.cost_share, "prefix_cache_share": s.prefix_cache_share,
            "speedup_median": s.speedup_median,
            "speedup_iqr": list(s.speedup_iqr) if s.speedup_iqr else None, "exact": s.exact,
            "flips": s.flips}
