"""Verdicts that know the edit, in the run page's words: did each strategy's answer name the
field's new value, the old one, both or neither (`vocabulary.verdicts.edit_followed`), was a
speed-up measured long enough to mean anything, and does a choice question's answer follow the
order of its choices more than the document.

When recompute's own answer names a value, a strategy is judged by whether it names the same side
(a strategy that follows the edit in other words is not "a different decision"); when it names
neither, the decision cannot tell the strategies apart and the page says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vocabulary import FLOOR
from vocabulary.speedups import MAX_RANGE_FACTOR, MIN_TIMED_MS, speedup_reading
from vocabulary.verdicts import edit_followed

# What each `edit_followed` value reads as on the page, and in the note's groups.
FOLLOWED_WORDS = {"new": "follows the edit", "old": "keeps the old value", "both": "names both values",
                  "neither": "names neither value"}



def values_of(snapshot: Any) -> tuple[list[str], list[str]]:
    """The snapshot's fields' old and new values."""
    fields = snapshot.fields if snapshot is not None else []
    return [f.old for f in fields], [f.new for f in fields]


def verdict_applies(snapshot: Any) -> bool:
    """Whether answers can name a field's value: a field changed, and the answer is free or one of
    the choices names an old or new value (a yes/no decision names neither: it is derived)."""
    if snapshot is None or not snapshot.fields:
        return False
    old, new = values_of(snapshot)
    choices = snapshot.question.choices
    return not choices or any(edit_followed(choice, old, new) != "neither" for choice in choices)


def followed(result: Any, snapshot: Any) -> str:
    """The stored `edit_followed` of `result`, or (runs stored before it existed) computed from its
    decision and the snapshot's values ("neither" when there is neither)."""
    stored = getattr(result, "edit_followed", None)
    if stored or snapshot is None:
        return stored or "neither"
    old, new = values_of(snapshot)
    return edit_followed(result.decision or "", old, new, snapshot.question.choices)


@dataclass(frozen=True)
class Mark:
    """The decision cell's verdict: `kind` yes | no | ref | neutral, and its words."""

    kind: str
    text: str


def mark(is_reference: bool, agrees: bool, mine: str | None, reference: str | None) -> Mark:
    """The verdict the decision cell leads with."""
    if is_reference:
        return Mark("ref", "the reference"
                    + (f" · {FOLLOWED_WORDS[mine]}" if mine and mine != "neither" else ""))
    if mine is None or reference in (None, "neither"):
        if mine == "new":  # recompute's answer names no value, this one names the new one
            return Mark("neutral", "names the new value (recompute's answer names neither)")
        return Mark("yes", "✓ same decision") if agrees else Mark("no", "✗ different decision")
    return Mark("yes" if agrees else "no", ("✓ " if agrees else "✗ ") + FOLLOWED_WORDS[mine])


def groups(rows: Sequence[Any]) -> str:
    """"follows the edit: in_place, field_erratum · keeps the old value: stale, erratum" over the
    strategies other than recompute."""
    parts = []
    for value, words in FOLLOWED_WORDS.items():
        names = [r.strategy for r in rows if not r.is_reference and r.followed == value]
        if names:
            parts.append(f"{words}: {', '.join(names)}")
    return " · ".join(parts)


@dataclass(frozen=True)
class Headline:
    """The run header's one line: `count` ("3 of 5", drawn bold; "" for none) then `text`."""

    count: str
    text: str


def headline(rows: Sequence[Any], has_fields: bool) -> Headline | None:
    """What the header says about the decisions, counting what recompute's verdict makes count."""
    compared = [r for r in rows if not r.is_reference and r.result is not None]
    reference = next((r for r in rows if r.is_reference and r.result is not None), None)
    if not compared or reference is None:
        return None
    count = f"{sum(r.agrees for r in compared)} of {len(compared)}"
    ref = reference.followed
    if ref == "new":
        return Headline(count, "strategies follow the edit, as recompute does")
    if ref == "old":
        return Headline("", "the edit did not change recompute's answer: it keeps the old value")
    if ref == "both":
        return Headline(count, "strategies name both values, as recompute does")
    if ref == "neither":
        return Headline("", "recompute's answer names neither value: read KL and NLL")
    stale = next((r for r in compared if r.strategy == FLOOR), None)
    if has_fields and stale is not None and stale.agrees:
        return Headline("", "the edit did not change recompute's decision: read KL and NLL")
    return Headline(count, "strategies give recompute's decision")


@dataclass(frozen=True)
class Timing:
    """Why a speed-up does not stand as one number (`vocabulary.speedups`): the cell's `label`
    ("too short to time", "noisy: 0.9–1.1×, about the same as recompute", "at least 4.1×"), `kind`
    short | noisy | bound | untimed, and the numbers behind it (the cell's tooltip)."""

    label: str
    kind: str
    tip: str
    floor: float | None = None  # a bound above 1×: the speed-up every paired round reached


def _spread(result: Any) -> tuple[float, float] | None:
    spread = getattr(result, "ttft_spread_ms", None)
    return (float(spread[0]), float(spread[1])) if spread and len(spread) == 2 else None


def speedup_range(result: Any) -> tuple[float, float] | None:
    """The stored [min, max] of the speed-up over the paired timing rounds (None before revision 0012)."""
    paired = getattr(result, "speedup_range", None)
    return (float(paired[0]), float(paired[1])) if paired and len(paired) == 2 else None


def timing(result: Any, reference: Any) -> Timing | None:
    """None when the speed-up over `reference` (recompute) stands; else how it reads and why
    (`vocabulary.speedups.speedup_reading`: under the floor, or a noisy range)."""
    ref_ms, mine_ms = reference.ttft_ms or 0.0, result.ttft_ms or 0.0
    if not ref_ms and not mine_ms and "not timed" in (getattr(result, "detail", "") or ""):
        return Timing("not timed", "untimed", "a sweep's decision-only edit: every strategy decided once, "
                      "without timing rounds; the sweep's timed edits give the speed-ups")
    mine, theirs, paired = _spread(result), _spread(reference), speedup_range(result)
    reading = speedup_reading(ref_ms, mine_ms, paired, theirs, mine)
    if reading is None:
        return None
    numbers = f"recompute {_ms(ref_ms, theirs)}, this strategy {_ms(mine_ms, mine)}"
    over = "the paired timings" if paired is not None else "the repeats"
    if reading.kind == "short":
        why = f"recompute's time to first token is under {MIN_TIMED_MS:.0f} ms"
    elif reading.low is not None and reading.low <= 1.0 <= (reading.high or 0.0):
        why = f"the speed-up ranges {reading.low:.1f}×–{reading.high:.1f}× over {over}, across 1×"
    elif reading.kind == "bound":
        side = "faster" if (reading.low or 0.0) > 1.0 else "slower"
        median = _x(getattr(result, "speedup", None))
        why = (f"{side} than recompute in every round: the speed-up ranges {reading.low:.1f}×–"
               f"{reading.high:.1f}× over {over} (median {median}), more than a factor of "
               f"{MAX_RANGE_FACTOR:.0f}")
    else:
        why = (f"the speed-up ranges {reading.low:.1f}×–{reading.high:.1f}× over {over}, more than a "
               f"factor of {MAX_RANGE_FACTOR:.0f}")
    floor = reading.low if reading.kind == "bound" and (reading.low or 0.0) > 1.0 else None
    return Timing(reading.label, reading.kind, f"{why}: {numbers}", floor)


def _x(speedup: float | None) -> str:
    return "not stored" if speedup is None else f"{speedup:.1f}×"


def _ms(median: float, spread: tuple[float, float] | None) -> str:
    return f"{median:.1f} ms" + (f" ({spread[0]:.1f}–{spread[1]:.1f})" if spread else "")


def order_flag(rows: Sequence[Any]) -> str | None:
    """When recompute's answer to a choice question follows the position of the choices more than
    the document (`order_bias`, measured over every cyclic order of the choices): the page's warning."""
    reference = next((r for r in rows if r.is_reference and r.result is not None), None)
    bias = getattr(reference.result, "order_bias", None) if reference is not None else None
    if not bias:
        return None
    return (f"This model picks the {bias} choice here: read KL instead. Asked in every cyclic order of "
            f"the choices, recompute's answer followed the {bias} position more often than the document.")
