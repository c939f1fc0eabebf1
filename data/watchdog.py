"""The one reaper: a job (run, trajectory, replay: `data.jobs.KINDS`) whose worker died, went silent
or lost its message is marked `failed` with the reason, never left `queued` or `running` in silence.

A live worker refreshes the job's `heartbeat_at` every few seconds while it works on it. A job whose
heartbeat (before the first one, its start; before that, its creation) is older than `max_age`
belongs to a worker that is gone. With the worker registry (`data.workers`) it does not wait for
the heartbeat age: a job held by a worker that stopped or stopped beating is failed at once, and a
job still `queued` while a live worker of its queue has sat idle for `QUEUED_GRACE_S` lost its
message (a worker took it and died before starting it, or a storage fault used it up): nothing of it
ran, so `reap` sends its message again once under a fresh token (lost again, it fails; a sweep's edit
fails and is retried by `data.sweep_edits`). A run queued for a model that this installation does not
serve (`KVNOTES_MODELS`) and no live worker holds is failed: it would wait forever. A trajectory or
replay still queued past the task time limit (+ 60 s) never had a worker take it, and is failed
saying so.

`reap` does all of this and commits; the workers' beat (`worker.presence`) and `kvnotes serve`
(`commands.supervisor`) call it every few seconds, never a web read. A worker starting, or a
supervisor whose worker died, fails the jobs held under that worker's name (`reap_worker`). A
sweep's edit failed here is queued again once (`data.sweep_edits.retry_lost_edits`, called once
these writes are committed).

The rules work on the caller's session (the caller commits); `reap` and `reap_worker` commit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from data.jobs import KINDS, REPLAYS, RUNS, TRAJECTORIES, JobKind, finish
from data.models import MESSAGE_LOST, WORKER_LOST, Run, RunStatus, as_utc, new_task_id  # the reasons
from data.queue import QueueUnavailable, queue_for
from data.settings import get_settings
from data.sweep_edits import retry_lost_edits
from data.workers import dead_worker_names, live_workers

log = logging.getLogger(__name__)
QUEUED_GRACE_S = 30.0  # a live idle worker takes a waiting message within a second or two
RESENT_STAGE = "queued again: its message was lost"
LOST_AGAIN = "its queue message was lost twice before it started (sent again once); re-run it"
DEADLINE_KINDS = (TRAJECTORIES, REPLAYS)  # a run queued for long waits for a worker (health says so)


@dataclass
class Reaped:
    """The ids of the jobs failed, by kind name, and the jobs whose lost message is to be sent again
    (kind, id, fresh token) once these writes are committed."""

    ids: dict[str, list[int]] = field(default_factory=dict)
    resend: list[tuple[JobKind, int, str]] = field(default_factory=list)

    def add(self, kind: JobKind, ids: list[int]) -> Reaped:
        if ids:
            self.ids.setdefault(kind.name, []).extend(ids)
        return self

    @property
    def runs(self) -> list[int]:
        return self.ids.get(RUNS.name, [])

    def __bool__(self) -> bool:
        return any(self.ids.values())


def _last_sign(row: Any) -> datetime | None:
    return as_utc(row.heartbeat_at) or as_utc(row.started_at) or as_utc(row.created_at)


def reap_stale(session: Session, kind: JobKind, now: datetime, max_age: float,
               worker: str | None = None) -> list[int]:
    """Fail the kind's jobs `running` without a heartbeat for `max_age` s (or, with `worker`, every
    job running under that worker, whatever its age: a worker starting up runs nothing yet)."""
    table = kind.table
    query = select(table).where(table.status == RunStatus.RUNNING.value)
    if worker is not None:
        query = query.where(table.worker == worker)
    else:
        last = func.coalesce(table.heartbeat_at, table.started_at, table.created_at)
        query = query.where(last < now - timedelta(seconds=max_age))
    reaped: list[int] = []
    for row in session.scalars(query.with_for_update()):
        last = _last_sign(row)
        if worker is None and last is not None and (now - last).total_seconds() < max_age:
            continue  # the SQL comparison on naive SQLite values said stale; trust the aware one
        finish(row, RunStatus.FAILED, WORKER_LOST, now=now)
        reaped.append(row.id)
    session.flush()
    return reaped


def reap_stale_runs(session: Session, now: datetime, max_age: float, worker: str | None = None) -> list[int]:
    """`reap_stale` for runs: the ids of the runs failed with `WORKER_LOST`."""
    return reap_stale(session, RUNS, as_utc(now) or datetime.now(UTC), max_age, worker)


def reap_of_dead_workers(session: Session, kind: JobKind, now: datetime) -> list[int]:
    """The kind's jobs `running` under a worker the registry knows to be stopped or silent."""
    dead = dead_worker_names(session, now)
    if not dead:
        return []
    table, reaped = kind.table, []
    for row in session.scalars(select(table).where(table.status == RunStatus.RUNNING.value,
                                                   table.worker.in_(dead))):
        finish(row, RunStatus.FAILED, WORKER_LOST, now=now)
        reaped.append(row.id)
    session.flush()
    return reaped


def reap_runs_of_dead_workers(session: Session, now: datetime) -> list[int]:
    return reap_of_dead_workers(session, RUNS, now)


def reap_lost(session: Session, kind: JobKind, now: datetime, grace_s: float = QUEUED_GRACE_S,
              resend: list[tuple[JobKind, int, str]] | None = None) -> list[int]:
    """The kind's jobs still `queued` after `grace_s` although a live worker of their queue has
    been idle for `grace_s`: their message is gone. Nothing of such a job ran, so with `resend` it
    stays queued under a fresh token, added to `resend` for its message to be sent again once
    (lost again, it fails); without, and for a sweep's edit (`data.sweep_edits` retries those), it
    fails with `MESSAGE_LOST`. The ids of the jobs failed."""
    idle_queues = {q for w in live_workers(session, now) if w.idle_for(now) > grace_s for q in w.queues}
    if not idle_queues:
        return []
    cutoff = now - timedelta(seconds=grace_s)
    table, reaped = kind.table, []
    # a queued job's heartbeat is when it was queued again (a sweep's edit after its worker was lost)
    queued_at = func.coalesce(table.heartbeat_at, table.created_at)
    waiting = select(table).where(table.status == RunStatus.QUEUED.value, queued_at < cutoff)
    for row in session.scalars(waiting):
        created = as_utc(row.heartbeat_at) or as_utc(row.created_at)
        if created is None or created >= cutoff or kind.queue_of(row) not in idle_queues:
            continue
        if resend is not None and row.stage != RESENT_STAGE and getattr(row, "sweep_id", None) is None:
            row.task_id, row.stage, row.heartbeat_at = new_task_id(), RESENT_STAGE, now
            resend.append((kind, row.id, row.task_id))
            continue
        finish(row, RunStatus.FAILED, LOST_AGAIN if row.stage == RESENT_STAGE else MESSAGE_LOST, now=now)
        reaped.append(row.id)
    session.flush()
    return reaped


def reap_lost_messages(session: Session, now: datetime, grace_s: float = QUEUED_GRACE_S) -> list[int]:
    return reap_lost(session, RUNS, now, grace_s)


def reap_past_deadline(session: Session, kind: JobKind, now: datetime) -> list[int]:
    """The kind's jobs still queued past the task time limit + 60 s: no worker ever took them."""
    limit_s = get_settings().task_time_limit_s + 60
    table, reaped = kind.table, []
    rows = session.scalars(select(table).where(table.status == RunStatus.QUEUED.value,
                                               table.created_at < now - timedelta(seconds=limit_s)))
    for row in rows:
        if (now - as_utc(row.created_at)).total_seconds() < limit_s:
            continue
        finish(row, RunStatus.FAILED, f"the {kind.name} did not finish within {limit_s} s "
               "(KVNOTES_TASK_TIME_LIMIT + 60 s): no worker took its message; start it again", now=now)
        reaped.append(row.id)
    session.flush()
    return reaped


def unserved_queued_models(session: Session, now: datetime | None = None) -> list[str]:
    """Models of queued runs that this installation does not offer (`KVNOTES_MODELS`) and no live
    worker serves: those runs would wait forever."""
    offered = set(get_settings().models)
    snapshots = session.scalars(select(Run.snapshot).where(Run.status == RunStatus.QUEUED))
    queued = {snap.model for snap in snapshots}
    served = {q for w in live_workers(session, now) for q in w.queues}
    return sorted(model for model in queued if model not in offered and queue_for(model) not in served)


def reap_unserved(session: Session, now: datetime) -> list[int]:
    """Queued runs of a model nobody serves (see `unserved_queued_models`): failed with the reason."""
    unserved = unserved_queued_models(session, now)
    if not unserved:
        return []
    reaped = []
    for run in session.scalars(select(Run).where(Run.status == RunStatus.QUEUED)):
        if run.model in unserved:
            finish(run, RunStatus.FAILED, unserved_message(run.model), now=now)
            reaped.append(run.id)
    session.flush()
    return reaped


def unserved_message(model: str) -> str:
    served = ", ".join(get_settings().models)
    return f"no worker serves the model {model} here (KVNOTES_MODELS: {served}); run it on a served model"


def watch(session: Session, now: datetime | None = None) -> Reaped:
    """Every rule above, for every kind, on the caller's session (the caller commits)."""
    now = as_utc(now) or datetime.now(UTC)
    max_age = get_settings().heartbeat_max_age_s
    reaped = Reaped()
    for kind in KINDS:
        reaped.add(kind, reap_stale(session, kind, now, max_age) + reap_of_dead_workers(session, kind, now)
                   + reap_lost(session, kind, now, resend=reaped.resend))
    for kind in DEADLINE_KINDS:
        reaped.add(kind, reap_past_deadline(session, kind, now))
    return reaped.add(RUNS, reap_unserved(session, now))


def reap(session: Session, now: datetime | None = None) -> Reaped:
    """THE reaper: every rule, committed, then a sweep's lost edits queued again once. What the
    workers' beat and `kvnotes serve` run every few seconds."""
    reaped = watch(session, now)
    session.commit()
    _send_again(session, reaped)  # after the commit: a message is never sent before its row
    retry_lost_edits(session)
    if reaped:
        log.warning("reaper: jobs marked failed (their worker or message was lost)",
                    extra={"reaped": reaped.ids})
    return reaped


def _send_again(session: Session, reaped: Reaped) -> None:
    """Send the lost messages of `reaped.resend` again under their fresh tokens; a job whose message
    the broker refuses fails with `MESSAGE_LOST` instead."""
    for kind, job_id, token in reaped.resend:
        row = session.get(kind.table, job_id, populate_existing=True)  # as committed
        if row is None or row.task_id != token or row.status != RunStatus.QUEUED.value:
            continue  # deleted, cancelled or taken meanwhile
        try:
            kind.send(row)
            log.warning("reaper: a lost message sent again", extra={"job": kind.name, "job_id": job_id})
        except QueueUnavailable:
            finish(row, RunStatus.FAILED, MESSAGE_LOST)
            reaped.add(kind, [job_id])
            session.commit()


def reap_worker(session: Session, worker: str, now: datetime | None = None) -> Reaped:
    """Fail every job `running` under `worker` (it starts afresh, or it died), commit, and queue a
    sweep's edits among them again once."""
    now = as_utc(now) or datetime.now(UTC)
    reaped = Reaped()
    for kind in KINDS:
        reaped.add(kind, reap_stale(session, kind, now, 0.0, worker=worker))
    session.commit()
    retry_lost_edits(session)
    return reaped
