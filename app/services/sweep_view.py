"""THE view of a sweep (`SweepView`, pydantic), built once from the database: the page, the JSON API
(`GET /api/sweeps/{id}`), the exports and the offline report all render this one value.

The statistics are `vocabulary.sweeps`, computed from the stored run results of the finished
edits each time (`data.sweep_records`: only the columns they need, never the attention), so a
threshold moved on the page gives a new policy without running anything again. Intervals are 95%
confidence sequences (`vocabulary.confidence`), valid at every look.
"""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from app.schema_types import Timestamp
from data.models import RUN_ACTIVE, Run, RunStatus, Sweep
from data.sweep_edits import (
    LOST_TWICE,
    REQUEUED_STAGE,
    STOPPED_CANCELLED,
    SWEEP_ATTEMPTS,
    awaiting_retry,
    waits_for_retry,
)
from data.sweep_records import edit_rows, stats_of
from vocabulary.confidence import INTERVAL_WORDS
from vocabulary.strategies import REFERENCE
from vocabulary.sweeps import (
    PAPER_MODEL,
    EditRecord,
    Share,
    Standing,
    StrategyStats,
    WorstCase,
    changed,
    decision_key,
    share_dict,
    standing_dict,
    strategy_dict,
)


class ShareOut(BaseModel):
    """k of n, the share and its 95% confidence sequence's interval (None when n is 0)."""

    value: float | None
    ci95: list[float] | None
    agreed: int
    edits: int

    @classmethod
    def of(cls, share: Share) -> ShareOut:
        return cls.model_validate(share_dict(share))


class StrategySweepOut(BaseModel):
    """One strategy over the sweep: agreement with recompute (determined edits; `flips`: where
    recompute kept the original decision and it did not), on changed edits, accuracy against
    `expected`, median KL, cost share, prefix-cache share and speed-up; and, for a candidate of the
    policy, where it stands against the threshold: `qualifies` (both lower bounds reach it),
    `proven_below` (an upper bound under it), `held_back` (which bounds kept it under: "determined",
    "changed"), `needed` (how many more changed edits, all agreeing, would lift both lower bounds
    to the threshold; null when none can) and `standing`, all that in words."""

    agreement: float | None
    agreement_ci95: list[float] | None
    agreed: int
    determined: int
    undetermined: int
    changed: ShareOut
    accuracy: ShareOut | None
    kl_median: float | None
    cost_share: float | None
    prefix_cache_share: float | None
    speedup_median: float | None
    speedup_iqr: list[float] | None
    exact: bool
    flips: int = 0
    qualifies: bool | None = None
    proven_below: bool | None = None
    held_back: list[str] = []
    needed: int | None = None
    needed_words: str | None = None
    standing: str | None = None

    @classmethod
    def of(cls, s: StrategyStats, standing: Standing | None = None,
           threshold: float = 0.0) -> StrategySweepOut:
        return cls.model_validate({**strategy_dict(s), **standing_dict(standing, threshold)})


class PolicyOut(BaseModel):
    strategy: str
    threshold: float
    sentence: str
    field: str = ""  # the field it is for ("" for the whole sweep)
    cost_share: float | None = None  # the strategy's share of recompute's tokens on those edits


class PolicyView(PolicyOut):
    """The overall policy; `decided`: it (and each per-field one) can no longer change, however the
    remaining edits go (every candidate cheaper than it proven below the threshold)."""

    decided: bool = False
    per_field: list[PolicyOut] = []


class FrontierPointOut(BaseModel):
    label: str
    agreement: float | None
    ci95: list[float] | None
    cost_share: float | None
    source: str


class EditResultOut(BaseModel):
    """One strategy on one edit: its decision, verdict, whether it decided as recompute (None:
    recompute's answer named no value), KL, tokens computed, time to first token."""

    decision: str
    edit_followed: str | None
    agrees: bool | None
    kl_to_recompute: float
    tokens_computed: int
    ttft_ms: float
    prefix_cache_share: float


class EditOut(BaseModel):
    """One edit: its run (an ordinary run page), status, values, and each strategy's result."""

    position: int
    run_id: int
    status: str
    error: str | None
    field: str
    values: dict[str, str]
    expected: str | None
    changed: bool | None
    results: dict[str, EditResultOut]
    # how many times a worker took it: 2 when its first worker was lost and it ran again
    attempts: int = 0
    retried: str | None = None  # says so, once it was queued again after its worker was lost


class SweepView(BaseModel):
    """Everything a sweep shows; `GET /api/sweeps/{id}` is exactly this."""

    id: int
    notebook_id: int | None
    model: str
    status: str
    question: str
    choices: list[str]
    strategies_asked: list[str]
    threshold: float
    edits_total: int
    edits_done: int
    edits_failed: int
    edits_retried: int  # queued again after their worker was lost (retried once at most)
    edits_skipped: int
    document_prefills: int
    stop_when_decided: bool = False
    # why it ended: "decided" (its policy could no longer change: the rest cancelled), "exhausted"
    # (every edit ran) or "cancelled"; null while it runs
    stopped: str | None = None
    extended_choices: list[str] = []  # values outside the question's choices, added to them on request
    interval: str = INTERVAL_WORDS
    error: str | None
    created_at: Timestamp  # with its time zone, as every timestamp the API returns (app.schema_types)
    finished_at: Timestamp | None
    strategies: dict[str, StrategySweepOut]
    policy: PolicyView
    frontier: list[FrontierPointOut]
    paper_model: str = PAPER_MODEL
    # every candidate's disagreements with recompute (at most 10 each, flips first), cheapest first;
    # vocabulary's dataclass: pydantic validates and dumps it as is
    worst_cases: list[WorstCase]
    edits: list[EditOut]
    # the finished edits timed in paired rounds (the speed-ups come from them); the rest decided only,
    # their reference computed exactly from the field on
    edits_timed: int = 0
    # the largest KL of that exact-from-the-field reference against the true recompute, checked on
    # the timed edits (None: no timed edit checked it)
    exact_reference_kl: float | None = None

    @property
    def timing_note(self) -> str:
        """What the speed-ups come from and how the untimed edits' reference was computed."""
        done = sum(e.status == RunStatus.SUCCEEDED for e in self.edits)
        if not done:
            return ""
        timed = (f"Speed-ups come from the {self.edits_timed} edit{'' if self.edits_timed == 1 else 's'} "
                 "timed in paired rounds" if self.edits_timed else "No edit was timed: no speed-up")
        if self.edits_timed >= done:
            return timed + "."
        kl = self.exact_reference_kl
        check = "" if kl is None else \
            f" (checked on the timed edits against a true recompute: KL at most {kl:.1e})"
        return (f"{timed}; the other {done - self.edits_timed} decided only, untimed, with the reference "
                f"computed exactly from the field on: the notes before the field are the same cache{check}.")

    @property
    def progress(self) -> str:
        return f"{self.edits_done} of {self.edits_total} edits"

    @property
    def ending(self) -> str:
        """How it ended, in words ("" while it runs)."""
        if self.stopped == "decided":
            return (f"Stopped after {self.edits_done} of {self.edits_total} edits: the policy was decided "
                    "(no later edit could change it), so the remaining edits were cancelled.")
        if self.stopped == "exhausted" and self.stop_when_decided:
            return f"Ran all {self.edits_total} edits: the policy was not decided before the last one."
        return ""

    @property
    def active(self) -> bool:
        return self.status in RUN_ACTIVE


def _results(record: EditRecord, choices: bool) -> dict[str, EditResultOut]:
    ref = record.outcomes.get(REFERENCE)
    ref_key = decision_key(ref, choices) if ref else None
    return {name: EditResultOut(
        decision=o.decision, edit_followed=o.followed,
        agrees=None if ref_key is None else decision_key(o, choices) == ref_key,
        kl_to_recompute=o.kl, tokens_computed=o.tokens, ttft_ms=o.ttft_ms,
        prefix_cache_share=o.prefix_cache_share) for name, o in record.outcomes.items()}


def sweep_status(session: Session, sweep: Sweep) -> str:
    """The sweep's status: its row's, except that a sweep with no edit left to run or to retry (its
    last edit failed for good by the watchdog, which does not know sweeps) reads as finished."""
    if sweep.status not in RUN_ACTIVE:
        return sweep.status
    active = session.scalar(select(func.count(Run.id)).where(
        Run.sweep_id == sweep.id, or_(Run.status.in_(RUN_ACTIVE), awaiting_retry()))) or 0
    if active:
        running = session.scalar(select(func.count(Run.id)).where(Run.sweep_id == sweep.id,
                                                                  Run.status != RunStatus.QUEUED)) or 0
        return RunStatus.RUNNING if running else RunStatus.QUEUED
    return RunStatus.SUCCEEDED


def _retried(run) -> str | None:
    """What an edit that was queued again after its worker was lost says (None: it was not)."""
    if (run.attempts or 0) >= SWEEP_ATTEMPTS and run.status != RunStatus.FAILED:
        return "retried once: its first worker was lost"
    if run.stage == REQUEUED_STAGE and run.status == RunStatus.QUEUED:
        return "queued again: its worker was lost"
    if run.status == RunStatus.FAILED and (run.error or "").startswith(LOST_TWICE):
        return "retried once, lost again"
    return None


def build_sweep_view(session: Session, sweep: Sweep, threshold: float | None = None) -> SweepView:
    """The one view of `sweep`, its policy at `threshold` (None: the sweep's own)."""
    threshold = sweep.threshold if threshold is None else threshold
    choices = bool(sweep.question.choices)
    rows = edit_rows(session, sweep.id)
    edits = [EditOut(position=r.edit.position, run_id=r.run_id, status=r.status, error=r.error,
                     field=r.edit.group, values=dict(r.edit.values), expected=r.edit.expected,
                     changed=changed(r.record, choices) if r.record else None,
                     results=_results(r.record, choices) if r.record else {},
                     attempts=r.attempts, retried=_retried(r)) for r in rows]
    stats = stats_of(sweep, rows, threshold)
    waiting = {r.run_id for r in rows if waits_for_retry(r.status, r.error, r.attempts)}  # queued again
    failed = sum(r.status == RunStatus.FAILED and r.run_id not in waiting for r in rows)
    retried = sum(_retried(r) is not None for r in rows)
    p = stats.policy
    standings = {st.name: st for st in p.standings}
    status = sweep_status(session, sweep)
    stopped = sweep.stopped or (STOPPED_CANCELLED if status == RunStatus.CANCELLED else
                                None if status in RUN_ACTIVE else "exhausted")
    return SweepView(
        id=sweep.id, notebook_id=sweep.notebook_id, model=sweep.model, status=status,
        question=sweep.question.text, choices=list(sweep.question.choices),
        strategies_asked=list(sweep.strategies), threshold=threshold, edits_total=sweep.edits_total,
        edits_done=sum(r.status in (RunStatus.SUCCEEDED, RunStatus.FAILED) for r in rows) - len(waiting),
        edits_failed=failed, edits_retried=retried, edits_skipped=sweep.edits_skipped,
        document_prefills=sweep.document_prefills, stop_when_decided=bool(sweep.stop_when_decided),
        stopped=stopped, extended_choices=list(sweep.extended_choices or []),
        error=sweep.error, created_at=sweep.created_at, finished_at=sweep.finished_at,
        strategies={name: StrategySweepOut.of(s, standings.get(name), threshold)
                    for name, s in stats.strategies.items()},
        policy=PolicyView(strategy=p.strategy, threshold=p.threshold, sentence=p.sentence,
                          cost_share=p.cost_share, decided=stats.decided,
                          per_field=[PolicyOut(strategy=q.strategy, threshold=q.threshold,
                                               sentence=q.sentence, field=q.group, cost_share=q.cost_share)
                                     for q in stats.policies]),
        frontier=[FrontierPointOut(label=f.label, agreement=f.agreement,
                                   ci95=list(f.ci95) if f.ci95 else None, cost_share=f.cost_share,
                                   source=f.source) for f in stats.frontier],
        worst_cases=list(stats.worst),
        edits=edits,
        **_timing(session, sweep.id),
    )


def _timing(session: Session, sweep_id: int) -> dict:
    """How many finished edits were timed (a run stored before issue 31 counts as timed), and the
    largest KL of the decision-only reference against the true recompute on them (`runs.timings`)."""
    done = [t or {} for t in session.scalars(select(Run.timings).where(
        Run.sweep_id == sweep_id, Run.status == RunStatus.SUCCEEDED))]
    kls = [t["exact_reference_kl"] for t in done if "exact_reference_kl" in t]
    return {"edits_timed": sum(bool(t.get("timed", 1.0)) for t in done),
            "exact_reference_kl": max(kls) if kls else None}
