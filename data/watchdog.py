"""The one reaper: a job (run, trajectory, replay: `data.jobs.KINDS`) that is lost — its own
heartbeat went silent, its message was lost, it ran past its deadline, or nobody serves its model —
is failed with the reason (or, once, queued again), never left `queued` or `running` in silence.

- **Silent** (`reap_stale`): a live worker refreshes its job's `heartbeat_at` every few seconds. A
  job `running` whose OWN heartbeat (before the first one, its start) is older than `max_age` is
  lost. The worker registry is not consulted: a worker whose registry beat is late (a slow disk, a
  busy database) but whose job still beats keeps its job. The exceptions are workers known for
  certain to be gone: one of this machine whose process no longer exists (`reap_gone`), and
  `reap_worker`: it starts afresh under the same name, or its supervisor saw its process exit.
- **Message lost** (`reap_lost`): a job still `queued` while a live worker of its queue has sat idle
  for `QUEUED_GRACE_S`: nothing of it ran.
- **Past its deadline** (`reap_overdue`): a job `running` for longer than its kind's deadline
  (`data.jobs.deadline_s`) + `DEADLINE_GRACE_S`: the task checks its deadline between steps, so
  one still running then is stuck in a step; it is failed saying so, and the supervisor of its
  worker replaces the worker (`commands.supervisor`). A trajectory or replay still queued, with no
  sign of a worker for its kind's deadline + 60 s, never had a worker take it (`reap_past_deadline`).
- **One clock**: heartbeats and the workers' beats are written on the database's clock, and the
  reaper reads `now` from it too (`data.models.db_now`), never a host's.
- **Unserved** (`reap_unserved`): a run queued for a model this installation does not serve.

**One retry path** (`lose`): a lost job is queued again from here and only from here, under a fresh
token (a message of the old token, delivered again by the broker, is dropped by the claim): a
sweep's edit while it has attempts left (`data.sweep_edits.SWEEP_ATTEMPTS`), any other job whose
message was lost, once. Every other lost job is failed with the reason. Every write is a
conditional transition (`data.jobs.transition`) that repeats the rule in its WHERE clause (still
running, still silent), so a job whose heartbeat, cancel or success lands in between is left alone.
A sweep whose edit was failed or queued again here is refreshed (`data.sweep_edits.refresh_sweep`).

`reap` does all of this and commits, then sends the messages again; the workers' reaper thread
(`worker.presence`) and `kvnotes serve` (`commands.supervisor`) call it every few seconds on a
session of short timeouts (`reaper_session`), never a web read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import delete, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from data.jobs import (
    KINDS,
    QUEUED,
    REPLAYS,
    RUNNING,
    RUNS,
    STUCK,
    TRAJECTORIES,
    JobKind,
    deadline_message,
    deadline_s,
    finish,
    transition,
)
from data.models import MESSAGE_LOST, WORKER_LOST, Run, RunResult, RunStatus, as_utc, db_now, new_task_id
from data.queue import QueueUnavailable, queue_for
from data.settings import get_settings
from data.sweep_edits import REQUEUED_STAGE, SWEEP_ATTEMPTS, lost_twice, refresh_sweep
from data.workers import Worker, live_workers

log = logging.getLogger(__name__)
QUEUED_GRACE_S = 30.0  # a live idle worker takes a waiting message within a second or two
DEADLINE_GRACE_S = 15.0  # past its deadline, the task stops at its next step; after this, it is stuck
QUEUED_PAST_S = 60.0  # a job queued and untouched this long past its kind's deadline: its message is gone
RESENT_STAGE = "queued again: its message was lost"
LOST_AGAIN = "its queue message was lost twice before it started (sent again once); re-run it"
DEADLINE_KINDS = (TRAJECTORIES, REPLAYS)  # a run queued for long waits for a worker (health says so)
REAPER_BUSY_TIMEOUT_MS = 1000  # the reaper's own waits for a lock: short, it comes back in seconds
REAPER_STATEMENT_TIMEOUT_MS = 5000


@dataclass
class Reaped:
    """The ids of the jobs failed, by kind name; the jobs queued again (kind, id, fresh token) whose
    message is sent once these writes are committed; the sweeps whose edits changed."""

    ids: dict[str, list[int]] = field(default_factory=dict)
    resend: list[tuple[JobKind, int, str]] = field(default_factory=list)
    sweeps: set[int] = field(default_factory=set)

    def add(self, kind: JobKind, ids: list[int]) -> Reaped:
        if ids:
            self.ids.setdefault(kind.name, []).extend(ids)
        return self

    @property
    def runs(self) -> list[int]:
        return self.ids.get(RUNS.name, [])

    def __bool__(self) -> bool:  # any job failed
        return any(self.ids.values())


def _last_sign(table: Any) -> Any:
    """SQL: when a running job last showed life (its heartbeat; before the first one, its start)."""
    return func.coalesce(table.heartbeat_at, table.started_at, table.created_at)


def lose(session: Session, kind: JobKind, row: Any, reason: str, now: datetime, reaped: Reaped,
         where: tuple = ()) -> bool:
    """The one retry path. `row` (as read) was lost for `reason` (`WORKER_LOST`, `MESSAGE_LOST`):
    queue it again under a fresh token when it may be (see the module's docstring), else fail it,
    both only while it is still as read (its status, and `where`). True when it was changed."""
    table, from_state = kind.table, row.status
    guard = (*where, table.task_id == row.task_id) if row.task_id else where
    edit = kind is RUNS and getattr(row, "sweep_id", None) is not None
    message_lost = reason == MESSAGE_LOST
    tries = (row.attempts or 0) + (1 if message_lost else 0) if edit else 0
    if edit and tries < SWEEP_ATTEMPTS:
        values: dict[str, Any] = {"stage": REQUEUED_STAGE, "attempts": tries}
    elif not edit and message_lost and row.stage != RESENT_STAGE:
        values = {"stage": RESENT_STAGE}
    else:
        error = lost_twice(reason) if edit else (LOST_AGAIN if row.stage == RESENT_STAGE else reason)
        done = finish(session, kind, row.id, RunStatus.FAILED, error, from_states=(from_state,), now=now,
                      where=guard, stage="failed")
        if done:
            reaped.add(kind, [row.id])
            if edit:
                reaped.sweeps.add(row.sweep_id)
        return done
    token = new_task_id()
    moved = transition(session, kind, row.id, (from_state,), QUEUED, where=guard, task_id=token,
                       worker=None, started_at=None, finished_at=None, heartbeat_at=now, progress=0.0,
                       error=None, **values)
    if moved:
        if kind is RUNS:  # what a lost attempt left is not the run's result
            session.execute(delete(RunResult).where(RunResult.run_id == row.id))
        reaped.resend.append((kind, row.id, token))
        if edit:
            reaped.sweeps.add(row.sweep_id)
    return moved


def reap_stale(session: Session, kind: JobKind, now: datetime, max_age: float, reaped: Reaped | None = None,
               worker: str | None = None) -> list[int]:
    """The kind's jobs `running` whose own heartbeat is older than `max_age` s (or, with `worker`,
    every job running under that worker, which is gone for certain): lost (`lose`). The ids of the
    jobs failed or queued again."""
    reaped = reaped if reaped is not None else Reaped()
    table = kind.table
    if worker is not None:
        rule: tuple = (table.worker == worker,)
    else:
        rule = (_last_sign(table) < now - timedelta(seconds=max_age),)
    rows = session.execute(select(table).where(table.status == RUNNING, *rule)).scalars().all()
    return [row.id for row in rows if lose(session, kind, row, WORKER_LOST, now, reaped, where=rule)]


def reap_gone(session: Session, kind: JobKind, now: datetime, reaped: Reaped) -> list[int]:
    """The kind's jobs `running` under a worker of this machine whose process no longer exists
    (`data.workers.Worker.process_gone`: a `kill -9`, certain, unlike a late registry beat)."""
    gone = [w.name for w in session.scalars(select(Worker).where(Worker.stopped_at.is_(None)))
            if w.process_gone()]
    return [job_id for name in gone for job_id in reap_stale(session, kind, now, 0.0, reaped, worker=name)]


def reap_stale_runs(session: Session, now: datetime, max_age: float, worker: str | None = None) -> list[int]:
    """`reap_stale` for runs: the ids of the runs lost."""
    return reap_stale(session, RUNS, as_utc(now) or db_now(session), max_age, worker=worker)


def reap_lost(session: Session, kind: JobKind, now: datetime, grace_s: float = QUEUED_GRACE_S,
              reaped: Reaped | None = None) -> list[int]:
    """The kind's jobs still `queued` after `grace_s` although a live worker of their queue has
    been idle for `grace_s`: their message is gone (`lose`). The ids of the jobs changed."""
    reaped = reaped if reaped is not None else Reaped()
    idle_queues = {q for w in live_workers(session, now) if w.idle_for(now) > grace_s for q in w.queues}
    if not idle_queues:
        return []
    table = kind.table
    # a queued job's heartbeat is when it was queued again
    rule = (func.coalesce(table.heartbeat_at, table.created_at) < now - timedelta(seconds=grace_s),)
    rows = session.execute(select(table).where(table.status == QUEUED, *rule)).scalars().all()
    return [row.id for row in rows if kind.queue_of(row) in idle_queues
            and lose(session, kind, row, MESSAGE_LOST, now, reaped, where=rule)]


def reap_lost_messages(session: Session, now: datetime, grace_s: float = QUEUED_GRACE_S) -> list[int]:
    return reap_lost(session, RUNS, now, grace_s)


def overdue_rule(kind: JobKind, now: datetime, grace_s: float = DEADLINE_GRACE_S) -> tuple:
    """SQL: the kind's running jobs claimed longer ago than its deadline + `grace_s`."""
    table = kind.table
    return (table.status == RUNNING, table.started_at < now - timedelta(seconds=deadline_s(kind) + grace_s))


def reap_overdue(session: Session, kind: JobKind, now: datetime, worker: str | None = None,
                 grace_s: float = DEADLINE_GRACE_S) -> list[int]:
    """Fail the kind's jobs still running past their deadline + `grace_s` (of `worker`, when
    given), saying so; the ids."""
    table, rule = kind.table, overdue_rule(kind, now, grace_s)
    if worker is not None:
        rule = (*rule, table.worker == worker)
    rows = session.execute(select(table.id, table.stage).where(*rule)).all()
    return [job_id for job_id, stage in rows
            if finish(session, kind, job_id, RunStatus.FAILED, deadline_message(kind, stage, stuck=True),
                      from_states=(RUNNING,), now=now, where=rule[1:], stage="failed")]


def stuck_jobs(session: Session, worker: str, since: datetime) -> list[tuple[str, int]]:
    """Jobs of `worker` the reaper failed since `since` because they were stuck in a step past their
    deadline (`reap_overdue`): (kind name, id). Its supervisor replaces such a worker."""
    found = []
    for kind in KINDS:
        table = kind.table
        found += [(kind.name, job_id) for job_id in session.scalars(select(table.id).where(
            table.worker == worker, table.status == RunStatus.FAILED.value, table.finished_at >= since,
            table.error.like(f"%{STUCK}%")))]
    return found


def reap_past_deadline(session: Session, kind: JobKind, now: datetime) -> list[int]:
    """The kind's jobs still queued, untouched by any worker for longer than the kind's own deadline
    (`deadline_s`: `KVNOTES_JOB_DEADLINE_S`, a replay's `KVNOTES_REPLAY_DEADLINE`) + `QUEUED_PAST_S`:
    no worker ever took their message. A queued job's last sign of a worker is its heartbeat (queued
    again by `lose`, or put back by the replays' fair share: `worker.replay_task`), else its creation,
    so a replay held back while its user's other replays hold half the threads is never failed so."""
    limit_s = deadline_s(kind) + QUEUED_PAST_S
    table = kind.table
    rule = (func.coalesce(table.heartbeat_at, table.created_at) < now - timedelta(seconds=limit_s),)
    ids = session.scalars(select(table.id).where(table.status == QUEUED, *rule)).all()
    setting = "KVNOTES_REPLAY_DEADLINE" if kind is REPLAYS else "KVNOTES_JOB_DEADLINE_S"
    message = (f"the {kind.name} waited {limit_s:g} s ({setting} + {QUEUED_PAST_S:g} s) and no worker took "
               "its message; start it again")
    return [job_id for job_id in ids
            if finish(session, kind, job_id, RunStatus.FAILED, message, from_states=(QUEUED,), now=now,
                      where=rule)]


def unserved_queued_models(session: Session, now: datetime | None = None) -> list[str]:
    """Models of queued runs that this installation does not offer (`KVNOTES_MODELS`) and no live
    worker serves: those runs would wait forever."""
    offered = set(get_settings().models)
    snapshots = session.scalars(select(Run.snapshot).where(Run.status == RunStatus.QUEUED))
    queued = {snap.model for snap in snapshots}
    if queued <= offered:
        return []
    served = {q for w in live_workers(session, now) for q in w.queues}
    return sorted(model for model in queued if model not in offered and queue_for(model) not in served)


def reap_unserved(session: Session, now: datetime, reaped: Reaped) -> list[int]:
    """Queued runs of a model nobody serves (see `unserved_queued_models`): failed with the reason."""
    unserved = unserved_queued_models(session, now)
    if not unserved:
        return []
    failed = []
    for run in session.scalars(select(Run).where(Run.status == RunStatus.QUEUED)).all():
        if run.model in unserved and finish(session, RUNS, run.id, RunStatus.FAILED,
                                            unserved_message(run.model), from_states=(QUEUED,), now=now):
            failed.append(run.id)
            if run.sweep_id is not None:
                reaped.sweeps.add(run.sweep_id)
    return failed


def unserved_message(model: str) -> str:
    served = ", ".join(get_settings().models)
    return f"no worker serves the model {model} here (KVNOTES_MODELS: {served}); run it on a served model"


def _sweeps_of(session: Session, run_ids: list[int]) -> set[int]:
    if not run_ids:
        return set()
    return {s for s in session.scalars(select(Run.sweep_id).where(Run.id.in_(run_ids))) if s is not None}


def watch(session: Session, now: datetime | None = None) -> Reaped:
    """Every rule above, for every kind, on the caller's session (the caller commits); `now`: the
    database's clock unless given."""
    now = as_utc(now) or db_now(session)
    max_age = get_settings().heartbeat_max_age_s
    reaped = Reaped()
    for kind in KINDS:
        overdue = reap_overdue(session, kind, now)
        if kind is RUNS:
            reaped.sweeps |= _sweeps_of(session, overdue)
        reaped.add(kind, overdue)
        reap_stale(session, kind, now, max_age, reaped)
        reap_gone(session, kind, now, reaped)
        reap_lost(session, kind, now, reaped=reaped)
    for kind in DEADLINE_KINDS:
        reaped.add(kind, reap_past_deadline(session, kind, now))
    return reaped.add(RUNS, reap_unserved(session, now, reaped))


def reap(session: Session, now: datetime | None = None) -> Reaped:
    """THE reaper: every rule, committed, then the messages of jobs queued again sent, and the
    sweeps whose edits changed refreshed. What the workers' reaper thread and `kvnotes serve` run
    every few seconds."""
    reaped = watch(session, now)
    return _after(session, reaped)


def _after(session: Session, reaped: Reaped) -> Reaped:
    session.commit()
    _send_again(session, reaped)  # after the commit: a message is never sent before its row
    for sweep_id in sorted(reaped.sweeps):
        refresh_sweep(session, sweep_id)
    if reaped or reaped.resend:
        log.warning("reaper: lost jobs failed or queued again",
                    extra={"reaped": reaped.ids, "queued_again": [(k.name, i) for k, i, _ in reaped.resend]})
    return reaped


def _send_again(session: Session, reaped: Reaped) -> None:
    """Send the messages of `reaped.resend` under their fresh tokens; a job whose message the broker
    refuses fails with `MESSAGE_LOST` instead (only while it is still queued under that token)."""
    for kind, job_id, token in reaped.resend:
        row = session.get(kind.table, job_id, populate_existing=True)  # as committed
        if row is None or row.task_id != token or row.status != QUEUED:
            continue  # deleted, cancelled or taken meanwhile
        try:
            kind.send(row)
            log.warning("reaper: a lost job's message sent again", extra={"job": kind.name, "job_id": job_id})
        except QueueUnavailable:
            if finish(session, kind, job_id, RunStatus.FAILED, MESSAGE_LOST, from_states=(QUEUED,),
                      where=(kind.table.task_id == token,)):
                reaped.add(kind, [job_id])
            session.commit()


def reap_worker(session: Session, worker: str, now: datetime | None = None) -> Reaped:
    """Every job `running` under `worker`, which is gone for certain (it starts afresh under the
    same name, or its supervisor saw it exit): lost (a sweep's edit queued again once). Commits."""
    now = as_utc(now) or db_now(session)
    reaped = Reaped()
    for kind in KINDS:
        reap_stale(session, kind, now, 0.0, reaped, worker=worker)
    return _after(session, reaped)


def _short_waits(dbapi_connection: Any, _record: Any) -> None:
    """The reaper's connections wait briefly for a lock (it comes back in seconds)."""
    cursor = dbapi_connection.cursor()
    if type(dbapi_connection).__module__.startswith("sqlite3"):
        cursor.execute(f"PRAGMA busy_timeout={REAPER_BUSY_TIMEOUT_MS}")
    else:
        cursor.execute(f"SET statement_timeout = {REAPER_STATEMENT_TIMEOUT_MS}")
        cursor.execute(f"SET lock_timeout = {REAPER_BUSY_TIMEOUT_MS}")
    cursor.close()
    if not type(dbapi_connection).__module__.startswith("sqlite3"):
        dbapi_connection.commit()


@lru_cache(maxsize=4)
def _reaper_sessions(url: str) -> sessionmaker[Session]:
    from data.db import make_engine, writable_only

    engine = writable_only(make_engine(url, pool_size=1, pool_timeout=2.0))
    event.listen(engine, "connect", _short_waits)  # after the engine's own pragmas
    return sessionmaker(bind=engine, expire_on_commit=False)


def reaper_session() -> Session:
    """A session for the reaper: its own small pool, short lock waits and statement time."""
    return _reaper_sessions(get_settings().database_url)()
