"""What the run page shows, computed from a run's rows: the decision diff table (one row per
strategy against recompute, each with whether it follows the edit: `app.web.runs.verdict_view`),
word-level differences of generated answers, the snapshot drawn with its fields, and the token
alignment the attention difference needs.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from app.services.attention import align_tokens, head_differences  # noqa: F401 (the run page's names for them)
from app.web.runs.verdict_view import (
    FOLLOWED_WORDS,
    Mark,
    Timing,
    followed,
    groups,
    mark,
    speedup_range,
    timing,
    values_of,
    verdict_applies,
)
from data.contracts import RunSnapshot, SnapshotField, SnapshotPlacement
from data.models import Run, RunResult
from vocabulary import FLOOR, REFERENCE
from vocabulary.agreement import agreement, by_verdict


@dataclass
class DecisionRow:
    strategy: str
    result: RunResult | None
    is_reference: bool
    agrees: bool  # names the value recompute names (when it names one), else the same decision
    tokens_pct: float | None  # tokens computed as % of recompute's
    speedup: float | None  # recompute's time to first token / this strategy's: the median over the
    # paired timing rounds (older runs: one division of the medians, or of the latencies)
    followed: str | None = None  # edit_followed: new | old | both | neither; None: answers name no value
    mark: Mark | None = None  # what the decision cell leads with
    timing: Timing | None = None  # set when the speed-up is too short to time, with why
    speedup_range: tuple[float, float] | None = None  # [min, max] over the paired rounds (None before)

    @property
    def quoted_speedup(self) -> tuple[float, str] | None:
        """The speed-up a summary may quote, as (how it ranks, how it reads): the median when it
        stands ("3.3×"), the floor when every paired round was faster ("at least 2.3×"); else None."""
        if self.is_reference or not self.speedup:
            return None
        if self.timing is None:
            return self.speedup, f"{self.speedup:.1f}×"
        if self.timing.floor is not None:
            return self.timing.floor, self.timing.label
        return None

    @property
    def followed_words(self) -> str:
        """"follows the edit", "keeps the old value", … ("" when answers name no value)."""
        return FOLLOWED_WORDS.get(self.followed or "", "")


EXACT_KL = 1e-6  # below this a strategy's first-token distribution is recompute's: nothing to see


def decision_rows(run: Run) -> list[DecisionRow]:
    """One row per strategy, recompute first. `run` may lack a snapshot (the home page's summary):
    then the stored verdicts are read when recompute's names a value, else the decision alone."""
    by_name = {r.strategy: r for r in run.results}
    ref = by_name.get(REFERENCE)
    snapshot = getattr(run, "snapshot", None)
    judged = verdict_applies(snapshot) if snapshot is not None else _stored_verdict(ref)
    ref_followed = followed(ref, snapshot) if judged and ref is not None else None
    order = [REFERENCE, *[s for s in run.strategies if s != REFERENCE]]
    order += [s for s in by_name if s not in order]
    rows = []
    for name in order:
        r = by_name.get(name)
        mine = followed(r, snapshot) if judged and r is not None else None
        agrees = _agrees(name, r, ref, snapshot, mine, ref_followed)
        pct = speed = None
        if r is not None and ref is not None:
            if ref.tokens_computed:
                pct = 100.0 * r.tokens_computed / ref.tokens_computed
            mine_ms, theirs = _first_token_ms(r), _first_token_ms(ref)
            stored = getattr(r, "speedup", None)
            if stored is not None:
                speed = stored
            elif mine_ms:
                speed = theirs / mine_ms
        tip = timing(r, ref) if r is not None and ref is not None and name != REFERENCE else None
        paired = speedup_range(r) if r is not None else None
        rows.append(DecisionRow(name, r, name == REFERENCE, agrees, pct, speed, mine,
                                mark(name == REFERENCE, agrees, mine, ref_followed), tip, paired))
    return rows


def _stored_verdict(ref: RunResult | None) -> bool:
    """Without the snapshot (the home page's summary), answers are judged by the stored verdicts
    when recompute's names a value: only then can its question name one (free, or a choice naming
    a value); "neither" falls back to the decision, as a yes/no question would."""
    return getattr(ref, "edit_followed", None) in ("new", "old", "both")


def _agrees(name: str, result: RunResult | None, ref: RunResult | None, snapshot: Any,
            mine: str | None, reference: str | None) -> bool:
    """The one agreement rule (`vocabulary.agreement`): recompute agrees with itself; with the
    snapshot, from the answers and the fields' values (the same choice, or the same values named,
    whatever the wording); without it, from the stored verdicts. Where recompute's answer names no
    value: the first answer token."""
    if name == REFERENCE:
        return True
    if result is None:
        return False
    first = getattr(result, "top1_agrees", None)
    if snapshot is not None and ref is not None:
        old, new = values_of(snapshot)
        return agreement(result.decision or "", ref.decision or "", choices=snapshot.question.choices,
                         values=[*old, *new] if reference is not None else [], first_token=first).agrees
    fallback = first if first is not None else bool(result.decision_matches_recompute)
    return by_verdict(mine, reference, fallback).agrees


def _first_token_ms(result: RunResult) -> float:
    """Time to first token; runs made before it was measured have only the whole latency."""
    return result.ttft_ms or result.latency_ms


def measured_ttft(run: Run) -> bool:
    """Whether this run measured time to first token (runs before revision 0002 did not)."""
    return any(r.ttft_ms for r in run.results)


def measured_decode(run: Run) -> bool:
    """Whether the run timed decoding: its answers went on past the first token (a free answer, or
    reasoning before a choice). A choice question's choices are scored with its first token
    (`worker.engine.readout`), so nothing is decoded after it and its stored decode time (0) is no
    measurement: the pages and exports leave it out."""
    question = run.snapshot.question if run.snapshot is not None else None
    return measured_ttft(run) and question is not None and (not question.choices or question.cot)


def agreement_summary(rows: list[DecisionRow]) -> tuple[int, int]:
    """(strategies agreeing with recompute, strategies compared), recompute itself excluded."""
    compared = [r for r in rows if not r.is_reference and r.result is not None]
    return sum(1 for r in compared if r.agrees), len(compared)


def default_strategy(rows: list[DecisionRow], with_attention: list[str]) -> str | None:
    """The strategy the attention view opens on: one whose decision differs from recompute's (the
    largest KL first), else the largest KL; never an exact strategy when another one exists."""
    candidates = [r for r in rows
                  if not r.is_reference and r.result is not None and r.strategy in with_attention]
    if not candidates:
        return None

    def rank(row: DecisionRow) -> tuple[bool, bool, float]:
        kl = row.result.kl_to_recompute
        return (not row.agrees, kl > EXACT_KL, kl)

    return max(candidates, key=rank).strategy


def run_note(rows: list[DecisionRow], snapshot: RunSnapshot) -> str:
    """What this run can and cannot tell apart, in one or two sentences computed from its rows;
    when answers can name the field's value, it leads with who follows the edit."""
    by_name = {r.strategy: r for r in rows if r.result is not None}
    ref, stale = by_name.get(REFERENCE), by_name.get(FLOOR)
    if ref is None:
        return ""
    others = [r for r in rows if not r.is_reference and r.result is not None]
    kind = "answer" if not snapshot.question.choices else "choice"
    if not snapshot.fields:
        follow = [r.strategy for r in others if r.agrees]
        return (f"No field changed: this run compares composing notes against recompute. "
                f"{len(follow)} of {len(others)} strategies give recompute's {kind}.")
    moved = (f"The edit moved recompute's {kind} from “{stale.result.decision}” (stale notes) to "
             f"{_quoted_end(ref.result.decision)} " if stale is not None and not stale.agrees else "")
    if ref.followed is not None:
        return _verdict_note(rows, ref.followed, kind, moved)
    if stale is not None and stale.agrees:
        return (f"The edit did not change recompute's {kind}: the stale notes give it too, so no strategy "
                "can be told apart on the decision. Look at KL, the NLL of recompute's answer and attention.")
    follow = [r.strategy for r in others if r.agrees]
    keep = [r.strategy for r in others if not r.agrees]
    follows = f"Following it: {', '.join(follow)}." if follow else "No strategy follows it."
    kept = f" Not following: {', '.join(keep)}." if keep else ""
    return moved + follows + kept


def _quoted_end(text: str) -> str:
    """`text` quoted to end a sentence: “…suspended.”, never “…suspended.”. (its own stop ends it)."""
    return f"“{text}”" if text.rstrip().endswith((".", "!", "?", "…")) else f"“{text}”."


def _verdict_note(rows: list[DecisionRow], reference: str, kind: str, moved: str) -> str:
    """The note when answers can name the field's value: the groups first, then what recompute did."""
    lead = groups(rows)
    lead = f"{lead[0].upper()}{lead[1:]}. " if lead else ""
    if reference == "new":
        return lead + (moved or f"Recompute's {kind} names the new value. ")
    if reference == "old":
        return lead + (f"Recompute's {kind} still names the old value: the edit did not change it, so "
                       "the decision cannot tell the strategies apart. Read KL and the NLL of recompute's "
                       "answer.")
    if reference == "both":
        return lead + f"Recompute's {kind} names both the old and the new value."
    return lead + (f"Recompute's own {kind} names neither the old nor the new value: this model does not "
                   "read the field back here, so the decision cannot tell the strategies apart. Read KL "
                   "and the NLL of recompute's answer instead.")


WORD = re.compile(r"\s+|[^\s]+")


def word_diff(reference: str, other: str) -> list[tuple[str, str]]:
    """`other` against `reference`, word by word: [(op, text)] with op equal | insert | delete."""
    a, b = WORD.findall(reference), WORD.findall(other)
    out: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("equal", "".join(b[j1:j2])))
        else:
            if i2 > i1:
                out.append(("delete", "".join(a[i1:i2])))
            if j2 > j1:
                out.append(("insert", "".join(b[j1:j2])))
    return out


def answer_of(result: RunResult) -> str:
    return result.text or result.decision or ""


@dataclass(frozen=True)
class SnapshotPiece:
    """A stretch of the snapshot's document: plain text, a field's old text with the field, or a
    placed skill's text (`skill`: its name) where the skill was spliced in."""

    text: str
    field: SnapshotField | None = None
    skill: str = ""


def placement_offsets(snapshot: RunSnapshot) -> list[tuple[int, SnapshotPlacement]]:
    """Each placed skill's document offset (the end for None; a field's end when inside one), in order."""
    length = len(snapshot.document)
    out = []
    for p in snapshot.placements:
        at = length if p.position is None else min(max(p.position, 0), length)
        at = next((f.end for f in snapshot.fields if f.start < at < f.end), at)
        out.append((at, p))
    return sorted(out, key=lambda x: x[0])


def snapshot_pieces(snapshot: RunSnapshot) -> list[SnapshotPiece]:
    """The snapshot's document as text pieces, field pieces and placed skills, in order."""
    document = snapshot.document
    skills = placement_offsets(snapshot)
    pieces: list[SnapshotPiece] = []
    cursor, k = 0, 0

    def text_to(end: int) -> None:  # plain text up to `end`, with the skills placed in it
        nonlocal cursor, k
        while k < len(skills) and skills[k][0] <= end:
            at, placement = skills[k]
            pieces.append(SnapshotPiece(document[cursor:at]))
            pieces.append(SnapshotPiece(placement.text, skill=placement.name or "skill"))
            cursor, k = at, k + 1
        pieces.append(SnapshotPiece(document[cursor:end]))
        cursor = end

    for f in sorted(snapshot.fields, key=lambda f: f.start):
        if f.start < cursor:
            continue
        text_to(f.start)
        pieces.append(SnapshotPiece(document[f.start : f.end], f))
        cursor = f.end
    text_to(len(document))
    return [p for p in pieces if p.text or p.field is not None]
