"""THE view of a sweep (`SweepView`, pydantic), built once from the database: the page, the JSON API
(`GET /api/sweeps/{id}`), the exports and the offline report all render this one value.

The statistics are `vocabulary.sweeps`, computed from the stored run results of the finished
edits each time (reading only the columns they need, never the attention), so a threshold moved on
the page gives a new policy without running anything again.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from data.contracts import SweepEdit
from data.models import RUN_ACTIVE, Run, RunResult, RunStatus, Sweep
from data.sweep_edits import LOST_TWICE, REQUEUED_STAGE, SWEEP_ATTEMPTS, awaiting_retry, waits_for_retry
from vocabulary.strategies import REFERENCE
from vocabulary.sweeps import (
    PAPER_MODEL,
    EditRecord,
    Outcome,
    Share,
    StrategyStats,
    WorstCase,
    changed,
    decision_key,
    share_dict,
    strategy_dict,
    sweep_stats,
)


class ShareOut(BaseModel):
    """k of n, the share and its Wilson 95% interval (None when n is 0)."""

    value: float | None
    ci95: list[float] | None
    agreed: int
    edits: int

    @classmethod
    def of(cls, share: Share) -> ShareOut:
        return cls.model_validate(share_dict(share))


class StrategySweepOut(BaseModel):
    """One strategy over the sweep: agreement with recompute (determined edits), on changed edits,
    accuracy against `expected`, median KL, cost share, prefix-cache share and speed-up."""

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

    @classmethod
    def of(cls, s: StrategyStats) -> StrategySweepOut:
        return cls.model_validate(strategy_dict(s))


class PolicyOut(BaseModel):
    strategy: str
    threshold: float
    sentence: str
    field: str = ""  # the field it is for ("" for the whole sweep)
    cost_share: float | None = None  # the strategy's share of recompute's tokens on those edits


class PolicyView(PolicyOut):
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
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    strategies: dict[str, StrategySweepOut]
    policy: PolicyView
    frontier: list[FrontierPointOut]
    paper_model: str = PAPER_MODEL
    worst_strategy: str
    worst_cases: list[WorstCase]  # vocabulary's dataclass: pydantic validates and dumps it as is
    edits: list[EditOut]

    @property
    def progress(self) -> str:
        return f"{self.edits_done} of {self.edits_total} edits"

    @property
    def active(self) -> bool:
        return self.status in RUN_ACTIVE


_COLUMNS = (RunResult.run_id, RunResult.strategy, RunResult.decision, RunResult.edit_followed,
            RunResult.kl_to_recompute, RunResult.tokens_computed, RunResult.prefix_cache_share,
            RunResult.ttft_ms, RunResult.speedup)


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
    runs = session.execute(select(Run.id, Run.status, Run.error, Run.sweep_edit, Run.attempts, Run.stage)
                           .where(Run.sweep_id == sweep.id).order_by(Run.id)).all()
    done_ids = [r.id for r in runs if r.status == RunStatus.SUCCEEDED]
    outcomes: dict[int, dict[str, Outcome]] = {rid: {} for rid in done_ids}
    if done_ids:
        for row in session.execute(select(*_COLUMNS).where(RunResult.run_id.in_(done_ids))):
            outcomes[row.run_id][row.strategy] = Outcome(
                decision=row.decision, followed=row.edit_followed, kl=row.kl_to_recompute,
                tokens=row.tokens_computed, prefix_cache_share=row.prefix_cache_share, ttft_ms=row.ttft_ms,
                speedup=row.speedup)
    records: list[EditRecord] = []
    edits: list[EditOut] = []
    for r in runs:
        edit: SweepEdit = r.sweep_edit or SweepEdit(position=len(edits), values={})
        record = None
        if r.id in outcomes:
            record = EditRecord(position=edit.position, group=edit.group, values=dict(edit.values),
                                expected=edit.expected, run_id=r.id, outcomes=outcomes[r.id])
            records.append(record)
        edits.append(EditOut(position=edit.position, run_id=r.id, status=r.status, error=r.error,
                             field=edit.group, values=dict(edit.values), expected=edit.expected,
                             changed=changed(record, choices) if record else None,
                             results=_results(record, choices) if record else {},
                             attempts=r.attempts or 0, retried=_retried(r)))
    stats = sweep_stats(records, sweep.strategies, choices, threshold)
    waiting = {r.id for r in runs if waits_for_retry(r.status, r.error, r.attempts)}  # to be queued again
    failed = sum(r.status == RunStatus.FAILED and r.id not in waiting for r in runs)
    retried = sum(_retried(r) is not None for r in runs)
    p = stats.policy
    return SweepView(
        id=sweep.id, notebook_id=sweep.notebook_id, model=sweep.model, status=sweep_status(session, sweep),
        question=sweep.question.text, choices=list(sweep.question.choices),
        strategies_asked=list(sweep.strategies), threshold=threshold, edits_total=sweep.edits_total,
        edits_done=sum(r.status in (RunStatus.SUCCEEDED, RunStatus.FAILED) for r in runs) - len(waiting),
        edits_failed=failed, edits_retried=retried, edits_skipped=sweep.edits_skipped,
        document_prefills=sweep.document_prefills,
        error=sweep.error, created_at=sweep.created_at, finished_at=sweep.finished_at,
        strategies={name: StrategySweepOut.of(s) for name, s in stats.strategies.items()},
        policy=PolicyView(strategy=p.strategy, threshold=p.threshold, sentence=p.sentence,
                          cost_share=p.cost_share,
                          per_field=[PolicyOut(strategy=q.strategy, threshold=q.threshold,
                                               sentence=q.sentence, field=q.group, cost_share=q.cost_share)
                                     for q in stats.policies]),
        frontier=[FrontierPointOut(label=f.label, agreement=f.agreement,
                                   ci95=list(f.ci95) if f.ci95 else None, cost_share=f.cost_share,
                                   source=f.source) for f in stats.frontier],
        worst_strategy=stats.worst_strategy,
        worst_cases=list(stats.worst),
        edits=edits,
    )
