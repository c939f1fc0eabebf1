"""A sweep's finished edits as the statistics read them (`vocabulary.sweeps.EditRecord`), from the
database: each succeeded edit's values and every strategy's stored outcome (only the columns the
statistics need, never the attention). The sweep's view (`app.services.sweep_view`) builds its
statistics from these, and so does the stop (`data.sweep_edits.refresh_sweep`, for a sweep that
stops as soon as its policy is decided)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from data.contracts import SweepEdit
from data.models import Run, RunResult, RunStatus, Sweep
from vocabulary.sweeps import EditRecord, Outcome, SweepStats, sweep_stats

_COLUMNS = (RunResult.run_id, RunResult.strategy, RunResult.decision, RunResult.edit_followed,
            RunResult.kl_to_recompute, RunResult.tokens_computed, RunResult.prefix_cache_share,
            RunResult.ttft_ms, RunResult.speedup)


@dataclass(frozen=True)
class EditRow:
    """One edit's run as the view lists it: its row's columns, and its record once it succeeded."""

    run_id: int
    status: str
    error: str | None
    edit: SweepEdit
    attempts: int
    stage: str | None
    record: EditRecord | None


def edit_rows(session: Session, sweep_id: int) -> list[EditRow]:
    """Every edit of the sweep in order, each succeeded one with its outcomes."""
    runs = session.execute(select(Run.id, Run.status, Run.error, Run.sweep_edit, Run.attempts, Run.stage)
                           .where(Run.sweep_id == sweep_id).order_by(Run.id)).all()
    done_ids = [r.id for r in runs if r.status == RunStatus.SUCCEEDED]
    outcomes: dict[int, dict[str, Outcome]] = {rid: {} for rid in done_ids}
    if done_ids:
        for row in session.execute(select(*_COLUMNS).where(RunResult.run_id.in_(done_ids))):
            outcomes[row.run_id][row.strategy] = Outcome(
                decision=row.decision, followed=row.edit_followed, kl=row.kl_to_recompute,
                tokens=row.tokens_computed, prefix_cache_share=row.prefix_cache_share, ttft_ms=row.ttft_ms,
                speedup=row.speedup)
    rows = []
    for i, r in enumerate(runs):
        edit: SweepEdit = r.sweep_edit or SweepEdit(position=i, values={})
        record = None
        if r.id in outcomes:
            record = EditRecord(position=edit.position, group=edit.group, values=dict(edit.values),
                                expected=edit.expected, run_id=r.id, outcomes=outcomes[r.id])
        rows.append(EditRow(r.id, r.status, r.error, edit, r.attempts or 0, r.stage, record))
    return rows


def stats_of(sweep: Sweep, rows: list[EditRow], threshold: float | None = None) -> SweepStats:
    """The sweep's statistics from its rows, the policy at `threshold` (None: the sweep's own)."""
    records = [r.record for r in rows if r.record is not None]
    return sweep_stats(records, sweep.strategies, bool(sweep.question.choices),
                       sweep.threshold if threshold is None else threshold)
