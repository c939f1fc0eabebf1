"""Which bundled model an example runs on: the one that reads its field back.

An example shows the notes effect only on a model whose recompute answer flips with the field (it
names the new value) while the stale notes keep the old one; on a model where either fails, every
strategy looks alike or recompute itself is wrong. Both rules here work from stored measurements
(`examples/<slug>.measured.json`, `examples/sweeps/<name>.measured.json`), so the choice and the
sentence that explains it are recomputed, never typed: the measuring scripts write them and the
tests derive them again. Models are given in preference order (the default model first), which
breaks ties. Stdlib only: the scripts, the web app and the tests share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

QUOTE_CHARS = 40  # an answer quoted in a reason is cut here, so the sentence stays short
NAMED = {"new": "the new value", "old": "the old value", "both": "both values", "neither": "neither value"}


def quoted(answer: str) -> str:
    """An answer in quotes, cut to `QUOTE_CHARS` characters with an ellipsis."""
    text = " ".join(answer.split())
    return f"“{text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 1].rstrip() + '…'}”"


@dataclass(frozen=True)
class Reading:
    """One model's run of an example: what recompute and the stale notes answered, and whether
    each answer names the field's new value (`edit_followed`: new | old | both | neither)."""

    model: str
    recompute: str
    recompute_followed: str
    stale: str
    stale_followed: str

    @property
    def reads_back(self) -> bool:
        return self.recompute_followed == "new" and self.stale_followed == "old"

    @property
    def score(self) -> int:
        """2 for recompute naming the new value, 1 for the stale notes keeping the old one."""
        return 2 * (self.recompute_followed == "new") + (self.stale_followed == "old")

    def failure(self) -> str:
        """Why this model does not read the field back ("" when it does)."""
        if self.recompute_followed != "new":
            return f"recompute named {NAMED[self.recompute_followed]}, {quoted(self.recompute)}"
        if self.stale_followed != "old":
            return f"the stale notes named {NAMED[self.stale_followed]}, {quoted(self.stale)}"
        return ""


def choose_model(readings: Sequence[Reading]) -> tuple[str, str]:
    """The model an example runs on and one sentence saying why. The first model that reads the
    field back wins (they come in the settings' order, the default model first); when none does,
    the one that comes closest."""
    if not readings:
        raise ValueError("choose_model: no readings")
    reading = [r for r in readings if r.reads_back]
    chosen = reading[0] if reading else max(readings, key=lambda r: r.score)  # max keeps the first of equals
    others = [r for r in readings if r is not chosen]
    if not reading:
        why = "".join(f"; on {r.model}, {r.failure()}" for r in others)
        return chosen.model, (f"On {chosen.model}: no bundled model reads the field back fully here; "
                              f"{chosen.model} comes closest ({chosen.failure()}{why}).")
    failed = [f"{r.model} does not read the field back here ({r.failure()})"
              for r in others if not r.reads_back]
    if failed:
        return chosen.model, f"On {chosen.model}: {'; '.join(failed)}."
    if others:
        names = ", ".join(r.model for r in others)
        return chosen.model, f"On {chosen.model}, the default model: {names} reads the field back here too."
    evidence = f"recompute answered {quoted(chosen.recompute)}, the stale notes {quoted(chosen.stale)}"
    return chosen.model, f"On {chosen.model}: it reads the field back here ({evidence})."


@dataclass(frozen=True)
class SweepReading:
    """One model's sweep of the field a question reads back: on how many edits recompute's answer
    named the new value (`followed`), of those on how many the stale notes kept the old one."""

    model: str
    followed: int
    stale_kept: int
    edits: int


def choose_sweep_model(readings: Sequence[SweepReading]) -> tuple[str, str]:
    """The model a sweep example runs on: the one whose recompute reads the field back on the most
    edits (then the stale notes keeping the old value on the most; then the default first)."""
    if not readings:
        raise ValueError("choose_sweep_model: no readings")
    best = max(readings, key=lambda r: (r.followed, r.stale_kept))
    told = "".join(f"; {r.model}'s on {r.followed} of {r.edits}" for r in readings if r is not best)
    return best.model, (f"On {best.model}: recompute named the new value on {best.followed} of "
                        f"{best.edits} edits (the stale notes kept the old one on {best.stale_kept}){told}.")
