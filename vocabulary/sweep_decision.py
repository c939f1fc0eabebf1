"""A sweep's policy at a threshold: each candidate's standing (does it qualify: both lower bounds,
on every determined edit and on the changed edits, reach the threshold; is it proven below; which
bound held it back; how many more changed edits, all agreeing, it would need), the policy (the
cheapest candidate that qualifies, else recompute) with its sentence, and whether it is decided
(every cheaper candidate proven below: no later edit can change it). Pure stdlib; re-exported by
`vocabulary.sweeps`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vocabulary.confidence import more_needed
from vocabulary.strategies import REFERENCE
from vocabulary.sweep_counts import StrategyStats

DEFAULT_THRESHOLD = 0.95


@dataclass(frozen=True)
class Standing:
    """One candidate against the threshold: whether it qualifies (both lower bounds reach it; an
    exact strategy: it agreed on every determined edit), whether it is proven below it (an upper
    bound under it: no later edit can make it qualify), which bounds held it back, how many more
    changed edits, all agreeing, would lift both lower bounds to the threshold (`needed`; None when
    none can: the floor keeps the original decision), and all that in one sentence."""

    name: str
    cost_share: float | None
    qualifies: bool
    below: bool
    held_back: tuple[str, ...]  # "determined" (every determined edit), "changed" (the changed edits)
    needed: int | None
    sentence: str


HELD_WORDS = {"determined": "its agreement on every determined edit",
              "changed": "its agreement on the changed edits"}


def held_words(held: Sequence[str]) -> str:
    """Which lower bounds kept a strategy under the threshold, in words."""
    return "both bounds" if len(held) > 1 else HELD_WORDS[held[0]] if held else "nothing"


def _bounds(s: StrategyStats) -> str:
    return (f"{s.agreement.k} of {s.agreement.n} determined edits (lower bound {s.agreement.lower:.2f}) "
            f"and {s.changed.k} of {s.changed.n} changed edits (lower bound {s.changed.lower:.2f})")


def needed_words(name: str, needed: int | None, threshold: float, below: bool = False) -> str:
    """What it would take, in words: "in_place would need at least 61 more changed edits, all
    agreeing, to reach 0.95". For a strategy already proven below the threshold (`below`) the count
    is still arithmetic, and the words say that it is not to be expected: a strategy that agrees less
    often than the threshold almost never agrees that many times in a row."""
    if needed is None:
        return f"{name} cannot reach {threshold:.2f}: no number of further edits lifts its lower bounds"
    if needed == 0:
        return f"{name} reaches {threshold:.2f}"
    words = (f"{name} would need at least {needed} more changed edit{'' if needed == 1 else 's'}, all "
             f"agreeing, to reach {threshold:.2f}")
    return f"{words}, which is not to be expected of a strategy proven below it" if below else words


def _all(n: int, noun: str) -> str:
    """"all 3 determined edits", "its one determined edit": never "all 1 edits"."""
    return f"its one {noun}" if n == 1 else f"all {n} {noun}s"


def standing(s: StrategyStats, threshold: float) -> Standing:
    """Where candidate `s` stands against `threshold` (see `Standing`)."""
    if s.role == "floor":
        return Standing(s.name, s.cost_share, False, True, ("changed",), None,  # below by construction
                        f"{s.name} keeps the original decision: it never follows a changed edit")
    if s.exact:
        ok = s.agreement.k == s.agreement.n
        agreed = (f"it agreed on {_all(s.agreement.n, 'determined edit')}" if s.agreement.n
                  else "by construction")
        return Standing(s.name, s.cost_share, ok, not ok, () if ok else ("determined",), 0 if ok else None,
                        f"{s.name} is exact ({agreed})" if ok else f"{s.name} is exact but agreed on "
                        f"{s.agreement.k} of {s.agreement.n} determined edits")
    held = tuple(name for name, share in (("determined", s.agreement), ("changed", s.changed))
                 if share.n == 0 or share.lower < threshold)
    below = any(share.n > 0 and share.upper < threshold for share in (s.agreement, s.changed))
    needed = more_needed([(s.agreement.k, s.agreement.n), (s.changed.k, s.changed.n)], threshold)
    if not held:
        sentence = f"{s.name} agreed with recompute on {_bounds(s)}, both >= {threshold:.2f}"
    else:
        why = held_words(held)
        flips = (f"; it moved off {s.flips} decision{'' if s.flips == 1 else 's'} recompute kept"
                 if s.flips else "")
        proven = (f"; proven below {threshold:.2f} (upper bound "
                  f"{min(s.agreement.upper, s.changed.upper):.2f})" if below else "")
        sentence = f"{s.name} agreed with recompute on {_bounds(s)}: held back by {why}{flips}{proven}"
    return Standing(s.name, s.cost_share, not held, below, held, needed, sentence)


def standing_dict(st: Standing | None, threshold: float) -> dict:
    """A candidate's standing in the shape the API and `kvnotes sweep --json` give it (empty for a
    strategy that is no candidate: the reference)."""
    if st is None:
        return {}
    return {"qualifies": st.qualifies, "proven_below": st.below, "held_back": list(st.held_back),
            "needed": st.needed, "needed_words": needed_words(st.name, st.needed, threshold, st.below),
            "standing": st.sentence}


@dataclass(frozen=True)
class Policy:
    """The strategy to use (recompute when none is safe enough), why, at which threshold; whether it
    is decided (no later edit can change it), and each candidate's standing, cheapest first."""

    strategy: str
    threshold: float
    sentence: str
    group: str = ""  # the field it is for ("" for the whole sweep)
    cost_share: float | None = None  # the strategy's share of recompute's tokens on these edits
    decided: bool = False
    standings: tuple[Standing, ...] = ()


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def candidates(stats: Sequence[StrategyStats]) -> list[StrategyStats]:
    """The strategies a policy may name (every one that runs alone but the reference), cheapest
    first; one with no finished edit has no cost yet and is left out."""
    out = [s for s in stats if s.role not in ("reference", "composite") and s.cost_share is not None]
    return sorted(out, key=lambda s: (s.cost_share, s.name))


def policy(stats: Sequence[StrategyStats], threshold: float = DEFAULT_THRESHOLD, group: str = "") -> Policy:
    """The cheapest candidate whose lower bounds on agreement over every determined edit AND over
    the changed edits both reach `threshold` (an exact strategy: it agreed on every determined
    edit), else recompute; decided once every cheaper candidate is proven below `threshold`."""
    ref = next((s for s in stats if s.role == "reference"), None)
    ranked = candidates(stats)
    standings = tuple(standing(s, threshold) for s in ranked)
    chosen = next((st for st in standings if st.qualifies), None)
    cheaper = [st for st in standings if chosen is None or st.cost_share < chosen.cost_share]
    decided = bool(standings) and all(st.below for st in cheaper)
    total = ref.edits if ref else 0
    moved = max((s.changed.n for s in stats), default=0)
    undetermined = ref.undetermined if ref else 0
    by_name = {s.name: s for s in ranked}
    approx = [st for st in cheaper if not by_name[st.name].exact and by_name[st.name].role != "floor"]
    best = max(approx, key=lambda st: (min(by_name[st.name].agreement.lower, by_name[st.name].changed.lower),
                                       -st.cost_share), default=None)
    if moved == 0 and ref is not None and undetermined == total:
        why = (f"recompute's answer named neither the old nor a new value on {_all(total, 'edit')} "
               "(undetermined: a free answer that does not read this field back cannot be scored by "
               "its verdict; ask with choices, or read KL)")
    elif moved == 0:
        why = (f"no edit changed recompute's decision ({total} edit{'' if total == 1 else 's'}, "
               f"{undetermined} undetermined): "
               "the sweep cannot tell the strategies apart on this prompt")
    elif best is not None:
        why = (f"{best.name} agreed with recompute on {_bounds(by_name[best.name])}: held back by "
               f"{held_words(best.held_back)}, below {threshold:.2f}")
    else:
        why = ""
    if chosen is None:
        return Policy(REFERENCE, threshold, f"{why or 'no strategy qualifies'}, so recompute", group, 1.0,
                      decided, standings)
    reason = f"{chosen.sentence}, at {_pct(chosen.cost_share)} of recompute's tokens"
    sentence = f"{why}, so {reason}" if why else reason[0].upper() + reason[1:]
    return Policy(chosen.name, threshold, sentence, group, chosen.cost_share, decided, standings)
