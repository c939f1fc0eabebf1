"""The watchdog: a run left `running` by a worker that died is marked `failed`, never left silent.

A live worker refreshes `runs.heartbeat_at` every few seconds while it works on a run. A run whose
heartbeat (or, before the first one, its start) is older than `max_age` belongs to a worker that is
gone. The web side calls `reap_stale_runs` when it reads runs; a worker calls it with `worker=` its
own hostname at start, where every run still `running` under its name is from its previous life.

Pure database work on the caller's session (the caller commits); no torch, no worker tasks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from data.models import Run, as_utc
from data.settings import get_settings

WORKER_LOST = "worker lost while running; re-run it"


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
    query = select(Run).where(Run.status == "running")
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
        run.status = "failed"
        run.error = WORKER_LOST
        run.stage = "failed"
        run.finished_at = now
        reaped.append(run.id)
    session.flush()
    return reaped


def reap_for_reader(session: Session) -> None:
    """What a web reader of runs calls first: lost runs become `failed` before anyone looks."""
    if reap_stale_runs(session, datetime.now(UTC), get_settings().heartbeat_max_age_s):
        session.commit()
