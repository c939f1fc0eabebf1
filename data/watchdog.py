"""The watchdog: a run left `running` by a worker that died is marked `failed`, never left silent.

A live worker refreshes `runs.heartbeat_at` every few seconds while it works on a run. A run whose
heartbeat (or, before the first one, its start) is older than `max_age` belongs to a worker that is
gone. The web side calls `reap_stale_runs` when it reads runs; a worker calls it with `worker=` its
own hostname at start, where every run still `running` under its name is from its previous life.
With the worker registry (`data.workers`) it does not wait for the heartbeat age: a run held by a
worker that stopped or stopped beating is failed at once, and a run still `queued` while a live
worker of its model has sat idle for `QUEUED_GRACE_S` lost its message (a worker took it and died
before starting it) and is failed too, as is a run queued for a model that this installation does
not serve (`KVNOTES_MODELS`) and no live worker holds: it would wait forever. `watch` does all of
this; workers call it every few seconds. A sweep's edit failed here is queued again once
(`data.sweep_edits.retry_lost_edits`, called once these writes are committed).

Pure database work on the caller's session (the caller commits); no torch, no worker tasks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from data.models import MESSAGE_LOST, WORKER_LOST, Run, RunStatus, as_utc  # the reasons it writes
from data.queue import queue_for
from data.settings import get_settings
from data.sweep_edits import retry_lost_edits
from data.workers import dead_worker_names, live_workers

QUEUED_GRACE_S = 30.0  # a live idle worker takes a waiting message within a second or two


def reap_stale_runs(session: Session, now: datetime, max_age: float, worker: str | None = None) -> list[int]:
    """Mark lost runs failed with `WORKER_LOST`; return their ids.

    Args:
        session: an open session; the caller commits.
        now: the current time (timezone-aware UTC).
        max_age: seconds without a heartbeat after which a running run counts as lost.
        worker: when given, every run `running` under this worker name is lost regardless of age
            (a worker starting up calls this: it runs nothing yet).
    """
    now = as_utc(now) or datetime.now(UTC)
    query = select(Run).where(Run.status == RunStatus.RUNNING)
    if worker is not None:
        query = query.where(Run.worker == worker)
    else:
        cutoff = now - timedelta(seconds=max_age)
        query = query.where(
            or_(
                Run.heartbeat_at < cutoff,
                (Run.heartbeat_at.is_(None)) & or_(Run.started_at.is_(None), Run.started_at < cutoff),
            )
        )
    reaped: list[int] = []
    for run in session.scalars(query.with_for_update()):
        last = as_utc(run.heartbeat_at) or as_utc(run.started_at)
        if worker is None and last is not None and (now - last).total_seconds() < max_age:
            continue  # the SQL comparison on naive SQLite values said stale; trust the aware one
        _fail(run, now, WORKER_LOST)
        reaped.append(run.id)
    session.flush()
    return reaped


def _fail(run: Run, now: datetime, message: str) -> None:
    run.status, run.error, run.stage, run.finished_at = RunStatus.FAILED, message, "failed", now


def reap_runs_of_dead_workers(session: Session, now: datetime) -> list[int]:
    """Runs `running` under a worker the registry knows to be stopped or silent: failed now."""
    dead = dead_worker_names(session, now)
    if not dead:
        return []
    reaped = []
    for run in session.scalars(select(Run).where(Run.status == RunStatus.RUNNING, Run.worker.in_(dead))):
        _fail(run, now, WORKER_LOST)
        reaped.append(run.id)
    session.flush()
    return reaped


def reap_lost_messages(session: Session, now: datetime, grace_s: float = QUEUED_GRACE_S) -> list[int]:
    """Runs still `queued` after `grace_s` although a live worker of their model has been idle for
    `grace_s`: their message is gone (taken by a worker that died before starting them)."""
    idle_queues = {q for w in live_workers(session, now) if w.idle_for(now) > grace_s for q in w.queues}
    if not idle_queues:
        return []
    cutoff = now - timedelta(seconds=grace_s)
    reaped = []
    # a queued run's heartbeat is when it was queued again (a sweep's edit after its worker was lost)
    queued_at = func.coalesce(Run.heartbeat_at, Run.created_at)
    for run in session.scalars(select(Run).where(Run.status == RunStatus.QUEUED, queued_at < cutoff)):
        created = as_utc(run.heartbeat_at) or as_utc(run.created_at)
        if created is not None and created < cutoff and queue_for(run.model) in idle_queues:
            _fail(run, now, MESSAGE_LOST)
            reaped.append(run.id)
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
            _fail(run, now, unserved_message(run.model))
            reaped.append(run.id)
    session.flush()
    return reaped


def unserved_message(model: str) -> str:
    served = ", ".join(get_settings().models)
    return f"no worker serves the model {model} here (KVNOTES_MODELS: {served}); run it on a served model"


def watch(session: Session, now: datetime | None = None) -> list[int]:
    """Every rule above, on the caller's session (the caller commits); the ids of runs failed."""
    now = now or datetime.now(UTC)
    return (reap_stale_runs(session, now, get_settings().heartbeat_max_age_s)
            + reap_runs_of_dead_workers(session, now) + reap_lost_messages(session, now)
            + reap_unserved(session, now))


def reap_for_reader(session: Session) -> None:
    """What a web reader of runs calls first: lost runs become `failed` before anyone looks, and a
    sweep's edits among them are queued again once (`data.sweep_edits`). A database that cannot be
    written (read-only, full) must not stop anyone reading: skipped then."""
    try:
        if watch(session):
            session.commit()
        retry_lost_edits(session)
    except DBAPIError:
        session.rollback()
