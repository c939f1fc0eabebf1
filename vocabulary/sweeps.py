"""A sweep's statistics: over many edits of one prompt, how often each strategy decides as recompute
does (with a Wilson 95% interval), on the edits where recompute's decision moved, what each costs,
the frontier beside the paper's points, and the policy that follows from a threshold.

Pure stdlib, no torch: the web app computes these from the stored run results each time a sweep is
shown, so moving the threshold never re-runs anything.

Definitions (issue 23):
- A strategy's *decision key* on an edit is its choice (a choice question) or its `edit_followed`
  verdict (a free answer). A free answer's edit is *determined* only where recompute's verdict names
  one side ("new" or "old"); the others are counted as `undetermined`.
- `agreement`: determined edits on which the key equals recompute's.
- `changed`: the same, on the edits where recompute's key differs from the original document's,
  which is `stale`'s (stale keeps the old notes whole, so its decision is the original one).
- `cost_share`: the strategy's tokens computed over recompute's, summed over edits.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from vocabulary.strategies import EDIT_INFO, REFERENCE
from vocabulary.verdicts import words

ORIGINAL = "stale"  # whose decision is the original document's
DETERMINED = ("new", "old")
DEFAULT_THRESHOLD = 0.95
Z95 = 1.959963984540054

# The paper's editing frontier: P(correct) and share of recompute over 8 gated tasks on an 8B model.
PAPER_MODEL = "the paper's 8B model"
PAPER_POINTS: tuple[tuple[str, float, float], ...] = (
    ("full reprefill", 1.00, 1.000),
    ("hoist-to-end", 1.00, 0.052),
    ("field+erratum", 1.00, 0.126),
    ("erratum", 1.00, 0.120),
    ("CacheBlend at 15%", 0.13, 0.145),
    ("in-place", 0.00, 0.006),
)


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of k successes in n trials (None when n is 0)."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Share:
    """k of n, its value (None when n is 0) and its Wilson 95% interval."""

    k: int
    n: int

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def ci95(self) -> tuple[float, float] | None:
        return wilson(self.k, self.n)

    @property
    def lower(self) -> float:
        ci = self.ci95
        return ci[0] if ci else 0.0

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
    """What is compared: the choice, or the free answer's verdict (None when it names no side)."""
    if choices:
        return outcome.decision.strip().lower() or None
    return outcome.followed if outcome.followed in DETERMINED else None


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
            "speedup_iqr": list(s.speedup_iqr) if s.speedup_iqr else None, "exact": s.exact}


@dataclass(frozen=True)
class Policy:
    """The strategy to use (recompute when none is safe enough), why, at which threshold."""

    strategy: str
    threshold: float
    sentence: str
    group: str = ""  # the field it is for ("" for the whole sweep)
    cost_share: float | None = None  # the strategy's share of recompute's tokens on these edits


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def policy(stats: Sequence[StrategyStats], threshold: float = DEFAULT_THRESHOLD, group: str = "") -> Policy:
    """The cheapest strategy whose lower bound on changed-edit agreement is at least `threshold`
    (an exact strategy qualifies when it agreed on every determined edit), else recompute."""
    ref = next((s for s in stats if s.name == REFERENCE), None)
    candidates = [s for s in stats if s.name not in (REFERENCE, "auto") and s.cost_share is not None]
    candidates.sort(key=lambda s: (s.cost_share, s.name))
    total = ref.edits if ref else 0
    moved = max((s.changed.n for s in stats), default=0)

    def passes(s: StrategyStats) -> bool:
        if s.exact:
            return s.agreement.k == s.agreement.n
        return s.changed.n > 0 and s.changed.lower >= threshold

    chosen = next((s for s in candidates if passes(s)), None)
    cheaper = [s for s in candidates if chosen is None or s.cost_share < chosen.cost_share]
    approx = [s for s in cheaper if not s.exact and s.name != ORIGINAL]
    best = max(approx, key=lambda s: (s.changed.lower, -s.cost_share), default=None)
    undetermined = ref.undetermined if ref else 0
    if moved == 0 and ref is not None and undetermined == total:
        why = (f"recompute's answer named neither the old nor a new value on all {total} edits "
               "(undetermined: a free answer that does not read this field back cannot be scored by "
               "its verdict; ask with choices, or read KL)")
    elif moved == 0:
        why = (f"no edit changed recompute's decision ({total} edits, {undetermined} undetermined): "
               "the sweep cannot tell the strategies apart on this prompt")
    elif best is not None:
        ci = best.changed.ci95
        bounds = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        why = (f"{best.name} followed recompute on {best.changed.k} of {best.changed.n} changed edits"
               f"{bounds}: below {threshold:.2f}")
    else:
        why = ""
    if chosen is None:
        return Policy(REFERENCE, threshold, f"{why or 'no strategy qualifies'}, so recompute", group, 1.0)
    if chosen.exact:
        agreed = (f"it agreed on all {chosen.agreement.n} determined edits" if chosen.agreement.n
                  else "by construction")
        reason = (f"{chosen.name}, which is exact ({agreed}), at {_pct(chosen.cost_share)} of "
                  "recompute's tokens")
    else:
        reason = (f"{chosen.name}: it followed recompute on {chosen.changed.k} of {chosen.changed.n} "
                  f"changed edits, lower bound {chosen.changed.lower:.2f} >= {threshold:.2f}, at "
                  f"{_pct(chosen.cost_share)} of recompute's tokens")
    sentence = f"{why}, so {reason}" if why else reason[0].upper() + reason[1:]
    return Policy(chosen.name, threshold, sentence, group, chosen.cost_share)


@dataclass(frozen=True)
class FrontierPoint:
    """One point of the frontier: changed-edit agreement (with interval) against cost share."""

    label: str
    agreement: float | None
    ci95: tuple[float, float] | None
    cost_share: float | None
    source: str  # "this sweep" or PAPER_MODEL


def frontier(stats: Sequence[StrategyStats]) -> list[FrontierPoint]:
    mine = [FrontierPoint(s.name, s.changed.value, s.changed.ci95, s.cost_share, "this sweep")
            for s in stats if s.name != "auto"]
    paper = [FrontierPoint(label, p, None, share, PAPER_MODEL) for label, p, share in PAPER_POINTS]
    return mine + paper


@dataclass(frozen=True)
class WorstCase:
    """An edit on which the strategy disagreed with recompute: the answers side by side."""

    position: int
    run_id: int
    values: dict[str, str]
    strategy: str
    answer: str
    recompute: str
    original: str
    expected: str | None


def worst_cases(edits: Sequence[EditRecord], strategy: str, choices: bool,
                limit: int = 20) -> list[WorstCase]:
    """Every determined edit on which `strategy` decided otherwise than recompute, changed edits first."""
    out: list[tuple[bool, WorstCase]] = []
    for e in edits:
        mine, ref = e.outcomes.get(strategy), e.outcomes.get(REFERENCE)
        if mine is None or ref is None or decision_key(ref, choices) is None:
            continue
        if decision_key(mine, choices) == decision_key(ref, choices):
            continue
        orig = e.outcomes.get(ORIGINAL)
        out.append((not changed(e, choices), WorstCase(e.position, e.run_id, dict(e.values), strategy,
                                                       mine.decision, ref.decision,
                                                       orig.decision if orig else "", e.expected)))
    out.sort(key=lambda pair: (pair[0], pair[1].position))
    return [case for _, case in out[:limit]]


@dataclass
class SweepStats:
    """Everything a sweep reports, from its finished edits."""

    strategies: dict[str, StrategyStats]
    policy: Policy
    policies: list[Policy] = field(default_factory=list)  # one per field when edited separately
    frontier: list[FrontierPoint] = field(default_factory=list)
    worst: list[WorstCase] = field(default_factory=list)
    worst_strategy: str = ""


def sweep_stats(edits: Sequence[EditRecord], strategies: Sequence[str], choices: bool,
                threshold: float = DEFAULT_THRESHOLD) -> SweepStats:
    names = [REFERENCE, *[s for s in strategies if s != REFERENCE]]
    stats = {name: strategy_stats(name, edits, choices) for name in names}
    overall = policy(list(stats.values()), threshold)
    groups = sorted({e.group for e in edits if e.group})
    policies = []
    if len(groups) > 1:
        for g in groups:
            mine = [e for e in edits if e.group == g]
            policies.append(policy([strategy_stats(n, mine, choices) for n in names], threshold, g))
    target = overall.strategy
    if target == REFERENCE:  # the best approximate strategy shows where it fails
        approx = [s for s in stats.values() if s.name not in (REFERENCE, ORIGINAL, "auto") and not s.exact]
        best = max(approx, key=lambda s: (s.changed.lower, s.agreement.lower), default=None)
        target = best.name if best else REFERENCE
    return SweepStats(strategies=stats, policy=overall, policies=policies,
                      frontier=frontier(list(stats.values())),
                      worst=worst_cases(edits, target, choices), worst_strategy=target)
