"""A sweep's edits after their worker or message was lost, and the sweep's progress and end.

"If a worker is lost mid-sweep, its edits are retried once, then marked failed with the reason. The
sweep finishes with what it has and says so" (issue 23). The one reaper (`data.watchdog.lose`) is
the one retry path: a lost edit with an attempt left (`SWEEP_ATTEMPTS`; `attempts` counts the
workers that took it, and a message lost before any took it counts as one) is queued again under a
fresh token (`REQUEUED_STAGE`), its partial results deleted; lost again, it fails for good with
`lost_twice` and the reason.

`refresh_sweep` writes the sweep's progress ("k of N edits") and, once no edit is left to run, its
end: with failures, "k of N edits; 1 failed: lost twice …" naming the reason. It runs whenever one
of the sweep's edits ends, whichever way (success, failure, cancel, a message dropped, the reaper).
The sweep's own state moves only by conditional transitions (`data.jobs.transition`): a sweep
cancelled a moment before is never rewritten as exhausted, and a sweep that ended is not ended twice.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from data.jobs import ACTIVE, RUNS, SWEEPS, transition
from data.models import MESSAGE_LOST, RUN_ACTIVE, WORKER_LOST, Run, RunStatus, Sweep
from data.queue import revoke
from data.sweep_records import edit_rows, stats_of

log = logging.getLogger(__name__)

SWEEP_ATTEMPTS = 2  # a sweep's edit runs at most twice: once, and once more if its worker was lost
LOST_TWICE = "lost twice (retried once after its worker was lost): "  # + the reason (`lost_twice`)
REQUEUED_STAGE = "queued again: its worker was lost"


def awaiting_retry():
    """(Rows of versions before the one reaper's retry path: nothing fails an edit so now.)
    SQL: a sweep's edit the watchdog failed as lost that has a retry left (`attempts` counts the
    workers that took it; a message lost before any took it counts as one)."""
    return and_(Run.sweep_id.is_not(None), Run.status == RunStatus.FAILED,
                or_(and_(Run.error == WORKER_LOST, Run.attempts < SWEEP_ATTEMPTS),
                    and_(Run.error == MESSAGE_LOST, Run.attempts + 1 < SWEEP_ATTEMPTS)))


def lost_twice(reason: str) -> str:
    """A sweep's edit lost on its second attempt: what its run says (the reason, without the
    watchdog's "re-run it": the sweep already did, once)."""
    return LOST_TWICE + reason.removesuffix("; re-run it")


def waits_for_retry(status: str, error: str | None, attempts: int | None) -> bool:
    """`awaiting_retry` on one sweep edit's values (the sweep's view counts it as not finished)."""
    tries = (attempts or 0) + (1 if error == MESSAGE_LOST else 0)
    return status == RunStatus.FAILED and error in (WORKER_LOST, MESSAGE_LOST) and tries < SWEEP_ATTEMPTS


def refresh_sweep(session: Session, sweep_id: int) -> None:
    """Write the sweep's progress (edits finished) and, once no edit is left to run, its end: it
    finishes with what it has and says how many edits failed and why. A sweep that stops when
    decided ends as soon as its policy cannot change (`stop_if_decided`). A cancelled or ended sweep
    stays as it is (every state change is a conditional transition). Commits."""
    sweep = session.get(Sweep, sweep_id, populate_existing=True)
    if sweep is None:
        return
    revoked = stop_if_decided(session, sweep)
    counts = dict(session.execute(select(Run.status, func.count(Run.id)).where(Run.sweep_id == sweep_id)
                                  .group_by(Run.status)).all())
    succeeded, failed = counts.get(RunStatus.SUCCEEDED, 0), counts.get(RunStatus.FAILED, 0)
    active = sum(counts.get(status, 0) for status in RUN_ACTIVE)
    session.execute(update(Sweep).where(Sweep.id == sweep_id).values(edits_done=succeeded + failed))
    if active == 0:
        transition(session, SWEEPS, sweep_id, ACTIVE, RunStatus.SUCCEEDED if succeeded else RunStatus.FAILED,
                   finished_at=datetime.now(UTC), stopped=STOPPED_EXHAUSTED,
                   error=ending(session, sweep_id, sweep.edits_total, succeeded, failed) if failed else None)
    else:
        transition(session, SWEEPS, sweep_id, (RunStatus.QUEUED,), RunStatus.RUNNING)
        # ended as exhausted, then an edit queued again (by a reaper of an older version): runs again
        transition(session, SWEEPS, sweep_id, (RunStatus.SUCCEEDED, RunStatus.FAILED), RunStatus.RUNNING,
                   where=(Sweep.stopped == STOPPED_EXHAUSTED,), finished_at=None, error=None, stopped=None)
    session.commit()
    for task_id in revoked:
        if task_id:
            revoke(task_id)


STOPPED_DECIDED, STOPPED_EXHAUSTED, STOPPED_CANCELLED = "decided", "exhausted", "cancelled"
DECIDED_STAGE = "cancelled: the sweep's policy was decided"


def cancel_edits(session: Session, sweep_id: int, stage: str = "cancelled") -> list[str | None]:
    """Move each of the sweep's unfinished edits to cancelled, each by a conditional transition (a
    running one stops at its next write; a queued one's message finds it cancelled and is dropped);
    the task ids of the edits it cancelled, to revoke once committed (an edit that finished in the
    meantime keeps its outcome and is not among them). Does not commit."""
    now = datetime.now(UTC)
    pending = session.execute(select(Run.id, Run.task_id).where(Run.sweep_id == sweep_id,
                                                                Run.status.in_(ACTIVE))).all()
    return [r.task_id for r in pending
            if transition(session, RUNS, r.id, ACTIVE, RunStatus.CANCELLED, stage=stage, finished_at=now)]


def stop_if_decided(session: Session, sweep: Sweep) -> list[str | None]:
    """For a sweep that stops when decided and still runs: if its policy (and each per-field one)
    can no longer change, end it, `stopped` "decided" (a conditional transition: a sweep cancelled
    meanwhile stays cancelled), and cancel its remaining edits. Returns the task ids to revoke once
    committed (none when it goes on)."""
    if not sweep.stop_when_decided or sweep.status not in RUN_ACTIVE:
        return []
    rows = edit_rows(session, sweep.id)
    stats = stats_of(sweep, rows)
    if not any(r.record for r in rows) or not stats.decided:
        return []
    if not transition(session, SWEEPS, sweep.id, ACTIVE, RunStatus.SUCCEEDED, stopped=STOPPED_DECIDED,
                      error=None, finished_at=datetime.now(UTC)):
        return []
    revoked = cancel_edits(session, sweep.id, DECIDED_STAGE)
    log.info("sweep stopped: its policy is decided",
             extra={"sweep_id": sweep.id, "edits_done": sum(r.record is not None for r in rows),
                    "policy": stats.policy.strategy, "cancelled": len(revoked)})
    return revoked


def ending(session: Session, sweep_id: int, total: int, succeeded: int, failed: int) -> str:
    """What a sweep that finished with failed edits says: "2 of 3 edits; 1 failed: <why>. The
    sweep reports the 2 that finished." (several reasons: the first, and that each run says why)."""
    reasons = list(dict.fromkeys(session.scalars(
        select(Run.error).where(Run.sweep_id == sweep_id, Run.status == RunStatus.FAILED).order_by(Run.id))))
    why = (reasons[0] or "no reason recorded") if reasons else "no reason recorded"
    if len(reasons) > 1:
        why += f" (and {len(reasons) - 1} other reason{'s' if len(reasons) > 2 else ''}: each run says why)"
    return (f"{succeeded} of {total} edits; {failed} failed: {why.rstrip('.')}. The sweep reports the "
            f"{succeeded} that finished")
