"""A notebook's adopted per-field policy applied to one run: which strategy `auto` runs when the run
edits one field, several, or a field the sweep did not vary. Pure stdlib, no torch: the web side
resolves it when it takes a run's snapshot (`RunSnapshot.policy` and `policy_note`), so the run
records exactly what `auto` was told and why.

The rule: the edited field's own policy; several edited fields, the most conservative of their
strategies (`caution`: recompute, then an exact strategy, then the larger share of recompute's
tokens); a field no per-field policy names, or a run that edits no field, the sweep's overall
policy (which is then one of those compared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vocabulary.strategies import EDIT_INFO, REFERENCE
from vocabulary.sweeps import Policy


def caution(strategy: str, cost_share: float | None) -> tuple[bool, bool, float]:
    """How conservative a strategy is (larger: more): recompute first, then an exact strategy,
    then by the share of recompute's tokens it computed in the sweep (computing more of the edited
    notes again leaves less to the old ones); an unknown share counts as the most (unsure: careful)."""
    info = EDIT_INFO.get(strategy)
    return strategy == REFERENCE, bool(info and info.exact), cost_share if cost_share is not None else 1.0


@dataclass(frozen=True)
class AppliedPolicy:
    """What `auto` runs on one run of a notebook with an adopted policy, and why in one sentence."""

    strategy: str
    note: str


def apply_policy(overall: str, per_field: Sequence[Policy], edited: Sequence[str]) -> AppliedPolicy:
    """The strategy `auto` runs for a run that edits the fields labelled `edited`, under an adopted
    overall policy (`overall`) and per-field policies (`per_field`, each with its `group`): the
    field's own policy; with several edited fields, the most conservative of their strategies
    (`caution`); a field no per-field policy names (or a run that edits no field) takes the overall
    policy, which is then one of those compared."""
    by_field = {p.group: p for p in per_field}
    edited = list(dict.fromkeys(edited))
    if not edited:
        return AppliedPolicy(overall, f"the run edits no field: the sweep's overall policy, {overall}")
    overall_share = next((p.cost_share for p in per_field if p.strategy == overall), None)
    picks = [(label, by_field[label].strategy, by_field[label].cost_share) if label in by_field
             else (label, overall, overall_share) for label in edited]
    parts = [f"{label} ({strategy})" if label in by_field else f"{label} (no policy of its own: the "
             f"overall {strategy})" for label, strategy, _ in picks]
    if len(picks) == 1:
        return AppliedPolicy(picks[0][1], f"the run edits {parts[0]}")
    strategy = max(picks, key=lambda p: caution(p[1], p[2]))[1]
    if len({s for _, s, _ in picks}) == 1:
        return AppliedPolicy(strategy, f"the run edits {_joined(parts)}: all {strategy}")
    return AppliedPolicy(strategy, f"the run edits {_joined(parts)}: the most conservative, {strategy}")


def _joined(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]

