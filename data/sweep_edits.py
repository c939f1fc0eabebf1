"""A sweep's edits after their worker was lost, and the sweep's progress and end.

"If a worker is lost mid-sweep, its edits are retried once, then marked failed with the reason. The
sweep finishes with what it has and says so" (issue 23). The watchdog (`data.watchdog`) fails a run
whose worker died (`WORKER_LOST`) or whose message went with a stopped worker (`MESSAGE_LOST`); it
knows nothing of sweeps. For a sweep's edit, `retry_lost_edits` then either:

- queues it again, once: a fresh message under a fresh token (the lost message, should the broker
  deliver it after all, holds the old token and is dropped by `worker.run_rows.claim`), its
  partial results deleted, `attempts` kept (a worker lost mid-edit already counted its attempt; a
  message lost before any worker took it counts as one here, so it is retried only once too);
- or, lost on its second attempt, fails it for good with `LOST_TWICE` and the reason, and writes
  the sweep's end when nothing else is left to run.

Nothing waits for the broker to deliver a lost message again (the embedded SQLAlchemy broker never
does). `refresh_sweep` writes the sweep's progress ("k of N edits") and, once no edit is left to run
or to retry, its end: with failures, "k of N edits; 1 failed: lost twice …" naming the reason.

The one reaper (`data.watchdog.reap`: the workers' beat and `kvnotes serve`, never a web read) calls
`retry_lost_edits` after its writes are committed: a message must never be sent before the row that
holds its token.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from data.models import MESSAGE_LOST, RUN_ACTIVE, WORKER_LOST, Run, RunResult, RunStatus, Sweep, new_task_id
from data.queue import SWEEP_PRIORITY, QueueUnavailable, enqueue_run, revoke
from data.sweep_records import edit_rows, stats_of

log = logging.getLogger(__name__)

SWEEP_ATTEMPTS = 2  # a sweep's edit runs at most twice: once, and once more if its worker was lost
LOST_TWICE = "lost twice (retried once after its worker was lost): "  # + the reason (`lost_twice`)
REQUEUED_STAGE = "queued again: its worker was lost"


def awaiting_retry():
    """SQL: a sweep's edit the watchdog failed as lost that has a retry left (`attempts` counts the
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


def _lost_for_good():
    """SQL: a sweep's edit failed as lost with no retry left."""
    return and_(Run.sweep_id.is_not(None), Run.status == RunStatus.FAILED,
                Run.error.in_((WORKER_LOST, MESSAGE_LOST)), ~awaiting_retry())


@dataclass
class Retried:
    """What `retry_lost_edits` did: edits queued again, and edits failed for good (lost twice)."""

    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def retry_lost_edits(session: Session) -> Retried:
    """Queue again once each sweep edit the watchdog failed as lost; fail for good one lost a second
    time. Commits `session` before sending any message; a message the broker refuses puts its edit
    back as it was (failed as lost), for the next call to try again. Edits of a cancelled sweep are
    left as they are."""
    done = Retried()
    live = select(Sweep.id).where(Sweep.status != RunStatus.CANCELLED)
    now = datetime.now(UTC)
    candidates = session.execute(select(Run.id, Run.error, Run.sweep_id).where(
        awaiting_retry(), Run.sweep_id.in_(live))).all()
    tokens: dict[int, tuple[str, str]] = {}
    for run_id, error, _sweep in candidates:
        token = new_task_id()
        # conditional: another reader or worker doing the same at once changes nothing twice
        moved = session.execute(
            update(Run).where(Run.id == run_id, awaiting_retry())
            .values(status=RunStatus.QUEUED, stage=REQUEUED_STAGE, progress=0.0, error=None, worker=None,
                    task_id=token, started_at=None, finished_at=None, heartbeat_at=now,
                    attempts=Run.attempts + (1 if error == MESSAGE_LOST else 0)))
        if moved.rowcount == 1:
            session.execute(delete(RunResult).where(RunResult.run_id == run_id))
            tokens[run_id] = (token, error)
    lost = session.execute(select(Run.id, Run.error, Run.sweep_id).where(
        _lost_for_good(), Run.sweep_id.in_(live))).all()
    for run_id, error, _sweep in lost:
        session.execute(update(Run).where(Run.id == run_id, _lost_for_good())
                        .values(error=lost_twice(error), stage="failed"))
        done.failed.append(run_id)
    sweeps = {sweep for rid, _, sweep in candidates if rid in tokens} | {sweep for _, _, sweep in lost}
    session.commit()  # every row and its token first: a worker never sees a message before its run
    for run_id, (token, error) in tokens.items():
        run = session.get(Run, run_id, populate_existing=True)  # as committed, not as the caller loaded it
        try:
            if run is None or run.task_id != token:
                continue  # deleted or taken meanwhile
            enqueue_run(run, priority=SWEEP_PRIORITY)
            done.requeued.append(run_id)
        except QueueUnavailable:
            session.execute(update(Run).where(Run.id == run_id, Run.task_id == token,
                                              Run.status == RunStatus.QUEUED)
                            .values(status=RunStatus.FAILED, stage="failed", error=error, finished_at=now,
                                    attempts=Run.attempts - (1 if error == MESSAGE_LOST else 0)))
            session.commit()
    for sweep_id in sorted(sweeps):
        refresh_sweep(session, sweep_id)
    if done.requeued or done.failed:
        log.warning("sweep edits lost with their worker: queued again once, or failed for good",
                    extra={"requeued": done.requeued, "failed": done.failed})
    return done


def refresh_sweep(session: Session, sweep_id: int) -> None:
    """Write the sweep's progress (edits finished) and, once no edit is left to run or to retry,
    its end: it finishes with what it has and says how many edits failed and why. A sweep that stops
    when decided ends as soon as its policy cannot change (`stop_if_decided`). A sweep whose edit was
    queued again after it had ended is running again; a cancelled sweep stays cancelled. Commits."""
    sweep = session.get(Sweep, sweep_id, with_for_update=True, populate_existing=True)
    if sweep is None:
        return
    revoked = stop_if_decided(session, sweep)
    counts = dict(session.execute(select(Run.status, func.count(Run.id)).where(Run.sweep_id == sweep_id)
                                  .group_by(Run.status)).all())
    waiting = session.scalar(select(func.count(Run.id))
                             .where(Run.sweep_id == sweep_id, awaiting_retry())) or 0
    succeeded = counts.get(RunStatus.SUCCEEDED, 0)
    failed = counts.get(RunStatus.FAILED, 0) - waiting
    active = sum(counts.get(status, 0) for status in RUN_ACTIVE) + waiting
    sweep.edits_done = succeeded + failed
    if sweep.status != RunStatus.CANCELLED and sweep.stopped != STOPPED_DECIDED:
        if active == 0 and sweep.status in RUN_ACTIVE:
            sweep.status = RunStatus.SUCCEEDED if succeeded else RunStatus.FAILED
            sweep.finished_at = datetime.now(UTC)
            sweep.stopped = STOPPED_EXHAUSTED
            sweep.error = ending(session, sweep_id, sweep.edits_total, succeeded, failed) if failed else None
        elif active:
            sweep.status, sweep.finished_at, sweep.error, sweep.stopped = RunStatus.RUNNING, None, None, None
    session.commit()
    for task_id in revoked:
        if task_id:
            revoke(task_id)


STOPPED_DECIDED, STOPPED_EXHAUSTED, STOPPED_CANCELLED = "decided", "exhausted", "cancelled"
DECIDED_STAGE = "cancelled: the sweep's policy was decided"


def cancel_edits(session: Session, sweep_id: int, stage: str = "cancelled") -> list[str | None]:
    """Mark the sweep's unfinished edits cancelled (a running one stops at its next progress write;
    a queued one's message finds it cancelled and is dropped); returns their task ids (one per edit
    cancelled) to revoke once committed. Does not commit."""
    now = datetime.now(UTC)
    pending = session.execute(select(Run.id, Run.task_id).where(
        Run.sweep_id == sweep_id, or_(Run.status.in_(RUN_ACTIVE), awaiting_retry()))).all()
    if pending:
        session.execute(update(Run).where(Run.id.in_([r.id for r in pending]))
                        .values(status=RunStatus.CANCELLED, stage=stage, finished_at=now))
    return [r.task_id for r in pending]


def stop_if_decided(session: Session, sweep: Sweep) -> list[str]:
    """For a sweep that stops when decided and still runs: if its policy (and each per-field one)
    can no longer change, cancel its remaining edits and end it, `stopped` "decided". Returns the
    task ids to revoke once committed (none when it goes on)."""
    if not sweep.stop_when_decided or sweep.status not in RUN_ACTIVE:
        return []
    rows = edit_rows(session, sweep.id)
    stats = stats_of(sweep, rows)
    if not any(r.record for r in rows) or not stats.decided:
        return []
    done = sum(r.record is not None for r in rows)
    revoked = cancel_edits(session, sweep.id, DECIDED_STAGE)
    sweep.status, sweep.stopped, sweep.finished_at = RunStatus.SUCCEEDED, STOPPED_DECIDED, datetime.now(UTC)
    sweep.error = None
    log.info("sweep stopped: its policy is decided",
             extra={"sweep_id": sweep.id, "edits_done": done, "policy": stats.policy.strategy,
                    "cancelled": len(revoked)})
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
