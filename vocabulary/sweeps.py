"""A sweep's statistics: over many edits of one prompt, how often each strategy decides as recompute
does, on every determined edit and on the edits where recompute's decision moved, each with a 95%
confidence sequence (`vocabulary.confidence`: valid at every look, so a sweep may stop as soon as
its policy is decided); what each costs; the frontier beside the paper's points; and the policy
that follows from a threshold, with each candidate's standing against it.

Pure stdlib, no torch: the web app computes these from the stored run results each time a sweep is
shown, so moving the threshold never re-runs anything.

Definitions (issues 23 and 31):
- A strategy's *decision key* on an edit is its choice (a choice question) or its `edit_followed`
  verdict (a free answer). A free answer's edit is *determined* only where recompute's verdict names
  one side ("new" or "old"); the others are counted as `undetermined`.
- `agreement`: determined edits on which the key equals recompute's. A *flip* is a disagreement on
  an edit where recompute kept the original decision.
- `changed`: the same, on the edits where recompute's key differs from the original document's,
  which is the floor's (`stale` keeps the old notes whole, so its decision is the original one).
- `cost_share`: the strategy's tokens computed over recompute's, summed over edits.
- The policy: the cheapest candidate (every strategy that can run alone but the reference) whose
  lower bounds on BOTH shares reach the threshold (an exact strategy: that agreed on every determined
  edit), else recompute. It is *decided* when it cannot change however the remaining edits go: the
  chosen candidate qualifies and every cheaper one is proven below the threshold (an upper bound
  under it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vocabulary.strategies import EDIT_INFO, REFERENCE
from vocabulary.sweep_counts import (
    DETERMINED,
    ORIGINAL,
    EditRecord,
    Outcome,
    Share,
    StrategyStats,
    changed,
    decision_key,
    matches_expected,
    share_dict,
    strategy_dict,
    strategy_stats,
    wilson,
)
from vocabulary.sweep_decision import (
    DEFAULT_THRESHOLD,
    Policy,
    Standing,
    candidates,
    held_words,
    needed_words,
    policy,
    standing,
    standing_dict,
)

__all__ = [  # the counting and the decision live in their own modules; their names are read from here too
    "DETERMINED", "ORIGINAL", "EditRecord", "Outcome", "Share", "StrategyStats", "changed", "decision_key",
    "matches_expected", "share_dict", "strategy_dict", "strategy_stats", "wilson", "DEFAULT_THRESHOLD",
    "Policy", "Standing", "candidates", "held_words", "needed_words", "policy", "standing",
    "standing_dict", "SWEEP_STRATEGIES", "PAPER_MODEL", "PAPER_POINTS", "FrontierPoint", "frontier",
    "WorstCase", "worst_cases", "SweepStats", "sweep_stats",
]

# What a sweep compares by default: every strategy that runs alone (not a composite such as auto)
SWEEP_STRATEGIES = tuple(name for name, info in EDIT_INFO.items() if info.role != "composite")


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
            for s in stats if s.role != "composite"]
    paper = [FrontierPoint(label, p, None, share, PAPER_MODEL) for label, p, share in PAPER_POINTS]
    return mine + paper


@dataclass(frozen=True)
class WorstCase:
    """An edit on which the strategy disagreed with recompute: the answers side by side, and whether
    recompute kept the original decision there (`kept`: a flip)."""

    position: int
    run_id: int
    values: dict[str, str]
    strategy: str
    answer: str
    recompute: str
    original: str
    expected: str | None
    kept: bool = False


def worst_cases(edits: Sequence[EditRecord], strategy: str, choices: bool,
                limit: int = 10) -> list[WorstCase]:
    """The determined edits on which `strategy` decided otherwise than recompute (at most `limit`):
    flips first (recompute kept the original decision: the failures a changed-edit count hides),
    then the changed edits it did not follow."""
    out: list[WorstCase] = []
    for e in edits:
        mine, ref = e.outcomes.get(strategy), e.outcomes.get(REFERENCE)
        if mine is None or ref is None or decision_key(ref, choices) is None:
            continue
        if decision_key(mine, choices) == decision_key(ref, choices):
            continue
        orig = e.outcomes.get(ORIGINAL)
        out.append(WorstCase(e.position, e.run_id, dict(e.values), strategy, mine.decision, ref.decision,
                             orig.decision if orig else "", e.expected, kept=not changed(e, choices)))
    out.sort(key=lambda case: (not case.kept, case.position))
    return out[:limit]


@dataclass
class SweepStats:
    """Everything a sweep reports, from its finished edits; `worst` lists every candidate's
    disagreements (at most 10 each), the cheapest candidate first."""

    strategies: dict[str, StrategyStats]
    policy: Policy
    policies: list[Policy] = field(default_factory=list)  # one per field when edited separately
    frontier: list[FrontierPoint] = field(default_factory=list)
    worst: list[WorstCase] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        """The overall policy and every per-field one can no longer change."""
        return self.policy.decided and all(p.decided for p in self.policies)


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
    ranked = candidates(list(stats.values())) + [s for s in stats.values()
                                                 if s.cost_share is None and s.role == "candidate"]
    worst = [case for s in ranked for case in worst_cases(edits, s.name, choices)]
    return SweepStats(strategies=stats, policy=overall, policies=policies,
                      frontier=frontier(list(stats.values())), worst=worst)
