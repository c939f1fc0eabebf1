"""The worker's side of the one job lifecycle (`data.jobs`), shared by every task that runs a job
(`kvnotes.run`, `kvnotes.trajectory`, `kvnotes.replay`): the claim, progress writes, the
heartbeat, and riding out a storage fault.

- **Storage faults.** A database that cannot be written for a while (read-only, full, locked)
  must not use up a message nor leave a job `queued` or `running` for good. Every write here goes
  through `through_faults`: tried again with a growing pause for `patience_s`. A claim that still
  cannot be written asks the broker to deliver its message again later (`claim_or_retry`), as runs
  always did; a broker that cannot take that either (the embedded one lives on the same disk) leaves
  the row queued for the reaper, which fails it as "message lost" once a worker sits idle.
- **The claim** (`claim`): the queued row that holds this message's token becomes `running` under
  this worker, with its first heartbeat, by one conditional transition (`data.jobs.transition`); any
  other message (its row deleted, cancelled, taken, or holding another token) is dropped at once. A
  kind's hook runs in the same transaction (a run's: `worker.run_rows.restart`).
- **Writes** (`write`, `finish`): conditional transitions on the row still being `running` under this
  worker, each one refreshing the heartbeat; False when the row was cancelled or reaped, so the task
  stops. A job's outcome (a run's with its results, in one transaction) is tried through a storage
  fault for `FINAL_PATIENCE_S`: a database hiccup at the end of a job does not drop what it computed.
- **Deadline**: `Heartbeat(deadline_s=…)` stops a job that ran past its kind's deadline
  (`data.jobs.deadline_s`) at its next step; the reaper fails one stuck in a step.
- **Heartbeat** (`Heartbeat`): a thread that looks at the row every `watch_s` and writes its
  heartbeat every `HEARTBEAT_S` (on the database's clock, `data.models.db_now`, which the reaper
  reads too: a worker's clock and the reaper's host's are never compared), so a long silent stage
  is not mistaken for a dead worker, and that sets `stop` once the row is no longer running (a
  cancel stops a replay's streams within seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import or_, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from data.db import get_sessionmaker
from data.jobs import QUEUED, JobKind, deadline_s, transition
from data.models import RunStatus, db_now

log = logging.getLogger(__name__)
T = TypeVar("T")

HEARTBEAT_S = 10.0  # a live job's heartbeat period; the reaper's max age is many of these
CLAIM_PATIENCE_S = 90.0  # a claim tried again in process this long through a storage fault ...
CLAIM_RETRIES = 12  # ... then the broker delivers its message again, up to this many times
CLAIM_RETRY_MAX_S = 60
WRITE_PATIENCE_S = 30.0  # a progress write: a job is not failed for a short fault
FINAL_PATIENCE_S = 120.0  # a job's outcome: kept trying longer, it is what the user waits for
PAUSE_MAX_S = 8.0
RUNNING = RunStatus.RUNNING.value


def session() -> Session:
    return get_sessionmaker()()


def now() -> datetime:
    return datetime.now(UTC)


def through_faults(fn: Callable[[], T], patience_s: float, what: str, **context: Any) -> T:
    """`fn()`, tried again through a storage fault (`DBAPIError`: read-only, full, locked) with a
    pause of 0.5 s doubling to `PAUSE_MAX_S`, for `patience_s` in all; then the error is raised."""
    deadline, pause = time.monotonic() + patience_s, 0.5
    while True:
        try:
            return fn()
        except DBAPIError as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("storage fault: trying again", extra={"doing": what, "reason": type(exc).__name__,
                                                              "retry_in_s": pause, **context})
            time.sleep(pause)
            pause = min(pause * 2, PAUSE_MAX_S)


def claim_or_retry(task: Any, claim_fn: Callable[[], T], what: str, **context: Any) -> T:
    """The task's claim, through a storage fault: tried again in process for `CLAIM_PATIENCE_S`,
    then by the broker (`task.retry`, 5 s doubling to `CLAIM_RETRY_MAX_S`, `CLAIM_RETRIES` times)."""
    try:
        return through_faults(claim_fn, CLAIM_PATIENCE_S, f"claim {what}", **context)
    except DBAPIError as exc:
        delay = min(CLAIM_RETRY_MAX_S, 5 * 2**task.request.retries)
        log.warning("cannot claim the job; the broker delivers its message again later",
                    extra={"job": what, "reason": type(exc).__name__, "retry_in_s": delay, **context})
        raise task.retry(countdown=delay, max_retries=CLAIM_RETRIES, exc=exc) from exc


def claim(kind: JobKind, job_id: int, task_id: str | None, hostname: str, stage: str,
          on_claim: Callable[[Session, Any], None] | None = None) -> Any | None:
    """Move the queued row of `kind` that holds this message's token to `running` under `hostname`
    (one conditional transition: of two messages, or a message and a cancel, one wins), then, in the
    same transaction, `on_claim(session, row)` (a run's restart hook); the row (detached: its
    columns as claimed), or None when there is none to run (deleted, cancelled, taken, or holding
    another token: the message is dropped)."""
    table = kind.table
    with session() as s:
        started = db_now(s)  # the database's clock, as the reaper reads it
        token = (or_(table.task_id.is_(None), table.task_id == task_id),) if task_id else ()
        if not transition(s, kind, job_id, (QUEUED,), RUNNING, where=token, stage=stage, worker=hostname,
                          started_at=started, heartbeat_at=started, finished_at=None):
            s.rollback()
            _dropped(s, kind, job_id, task_id)
            return None
        row = s.get(table, job_id, populate_existing=True)
        if on_claim is not None:
            on_claim(s, row)
        s.commit()
        s.refresh(row)
        s.expunge(row)
        return row


def _dropped(s: Session, kind: JobKind, job_id: int, task_id: str | None) -> None:
    """Say why a message was dropped at its claim (a lost race, a deleted row, another token)."""
    table, context = kind.table, {"job": kind.name, "job_id": job_id, "task_id": task_id}
    row = s.execute(select(table.status, table.task_id).where(table.id == job_id)).first()
    if row is None:
        log.warning("job does not exist (deleted, or never saved): message dropped", extra=context)
    elif task_id and row.task_id and row.task_id != task_id:
        log.warning("message is not the job's (another token): dropped",
                    extra={**context, "token": row.task_id})
    else:
        log.info("job already taken or finished: message dropped", extra={**context, "status": row.status})


def write(table: type, job_id: int, hostname: str | None, patience_s: float = WRITE_PATIENCE_S,
          to: RunStatus | None = None, also: Callable[[Session], None] | None = None, **values: Any) -> bool:
    """Update a running row of `table` (under `hostname`, when given), refreshing its heartbeat
    (with `to`, moving it to that status), through a storage fault for `patience_s`: one conditional
    transition, and `also(session)` in the same transaction when it won (a run's results). False
    when it is no longer running (or ours): cancelled, reaped, deleted."""
    mine = (table.worker == hostname,) if hostname is not None else ()

    def once() -> bool:
        with session() as s:
            moved = transition(s, table, job_id, (RUNNING,), to.value if to is not None else None,
                               where=mine, heartbeat_at=db_now(s), **values)
            if moved and also is not None:
                also(s)
            s.commit()
        return moved

    return through_faults(once, patience_s, f"write {table.__tablename__}", job_id=job_id)


def finish(table: type, job_id: int, hostname: str | None, status: RunStatus,
           also: Callable[[Session], None] | None = None, **values: Any) -> bool:
    """Write a running job's outcome (`status`, `finished_at`, `values`, and `also` in the same
    transaction), kept trying through a storage fault for `FINAL_PATIENCE_S`; False when it was no
    longer running (cancelled, reaped): of a cancel and a success, exactly one is written."""
    return write(table, job_id, hostname, FINAL_PATIENCE_S, to=status, also=also, **values)


def held_back(kind: JobKind, job_id: int, task_id: str | None, every_s: float = 60.0) -> bool:
    """A queued job whose message a worker put back for now (the replays' fair share): its heartbeat
    (the database's clock) says a worker saw it, at most once every `every_s`, so the reaper never
    fails it as a message no worker took (`data.watchdog.reap_past_deadline`). One conditional
    transition on the row still queued under this token; False when it did not apply. A storage
    fault is logged, not raised: the message goes back all the same."""
    table = kind.table
    token = (table.task_id == task_id,) if task_id else ()
    try:
        with session() as s:
            moment = db_now(s)
            lately = moment - timedelta(seconds=every_s)
            seen = (or_(table.heartbeat_at.is_(None), table.heartbeat_at < lately),)
            moved = transition(s, kind, job_id, (QUEUED,), where=(*token, *seen), heartbeat_at=moment)
            s.commit()
        return moved
    except DBAPIError as exc:
        log.info("held-back job: its heartbeat not written", extra={"job": kind.name, "job_id": job_id,
                                                                     "reason": type(exc).__name__})
        return False


def lost(table: type, job_id: int, meant: RunStatus | str, **context: Any) -> str:
    """A worker's final write (`meant`) lost its transition to another writer (a cancel, the reaper,
    a delete): log what won (the row's status now and its error, or "deleted") and return it. The
    caller then says that status, never its own: a replay lost to a cancel never logs success."""
    try:
        with session() as s:
            row = s.execute(select(table.status, table.worker, table.error).where(table.id == job_id)).first()
    except DBAPIError:  # cannot be read now: say so rather than guess
        row, won = None, "unknown"
    else:
        won = "deleted" if row is None else str(row.status)
    log.info("job's outcome not written: another writer won",
             extra={"job": table.__tablename__, "job_id": job_id, "meant": str(meant), "won": won,
                    "won_with": (row.error or "")[:200] if row is not None else "", **context})
    return won


def past_deadline(kind: JobKind, started: float) -> bool:
    """Whether a job of `kind` started at `started` (`time.monotonic()`) has run past its deadline."""
    return time.monotonic() - started > deadline_s(kind)


class Heartbeat:
    """While a job runs: look at its row every `watch_s`, write its heartbeat every `HEARTBEAT_S`,
    and set `stop` once it is no longer running under this worker (cancelled, reaped, deleted) or,
    with `deadline_s`, once it has run that long (`overdue` then says so: the task fails the job
    saying it ran past its deadline)."""

    def __init__(self, table: type, job_id: int, hostname: str | None, watch_s: float = HEARTBEAT_S,
                 deadline_s: float | None = None) -> None:
        self.table, self.job_id, self.hostname, self.watch_s = table, job_id, hostname, watch_s
        self.stop = threading.Event()
        self.overdue = threading.Event()
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"{table.__tablename__}-{job_id}-heartbeat")

    def _ours(self) -> bool:
        table = self.table
        with session() as s:
            row = s.execute(select(table.status, table.worker).where(table.id == self.job_id)).first()
        return row is not None and row.status == RUNNING and self.hostname in (None, row.worker)

    def check_deadline(self) -> bool:
        """True (and `stop`, `overdue` set) once the job has run past its deadline."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.overdue.set()
            self.stop.set()
        return self.overdue.is_set()

    def _run(self) -> None:
        last_beat = time.monotonic()
        while not self._done.wait(self.watch_s):
            self.check_deadline()
            try:
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    ours = write(self.table, self.job_id, self.hostname, patience_s=0.0)
                    last_beat = time.monotonic()
                else:
                    ours = self._ours()
            except Exception as exc:  # a busy or read-only database must not stop the job: next time
                log.info("heartbeat: cannot reach its row", extra={"job": self.table.__tablename__,
                                                                   "job_id": self.job_id,
                                                                   "reason": type(exc).__name__})
                continue
            if not ours:
                self.stop.set()
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.watch_s + 1)
