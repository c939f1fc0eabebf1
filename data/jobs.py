"""One job lifecycle for every kind of background work: runs (a sweep's edits are runs),
trajectories and replays (of an edit or of a trajectory).

A job is a row with the same lifecycle whatever its kind:

    queued ──claim──▶ running ──▶ succeeded | failed | cancelled
       └──────────── cancelled / failed (lost message, no worker) ◀──┘

- **Queued**: the row (with its message token, `task_id`) is committed before its message is sent;
  a broker that refuses the message deletes the row again (`app.services.jobs.enqueue_or_unsave`).
- **Running**: a worker claims the queued row that holds its message's token (`worker.jobs.claim`,
  which retries through a storage fault), writes `worker` and `heartbeat_at`, and beats while it
  works (`worker.jobs.Heartbeat`); every later write is conditional on the row still being running,
  so a cancel or a reap stops the worker at its next write.
- **Lost**: the one reaper (`data.watchdog.reap`, run by the workers' beat and by `kvnotes serve`,
  never by a read) fails a job whose worker died or went silent, or whose message was lost.

Each kind is a `JobKind`: its table, its task, the queue it goes to, and which of its rows count
against the per-user caps (a sweep's edits have the sweep's cap instead). The caps count every
kind together (`active_jobs`): one user's replays and runs share that user's cap.

Pure database work on the caller's session (the caller commits); no torch, no worker tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select, true
from sqlalchemy.orm import Session

from data.models import RUN_ACTIVE, Base, Run, RunStatus, utcnow
from data.queue import (
    REPLAY_QUEUE,
    TASK_REPLAY,
    TASK_RUN,
    TASK_TRAJECTORY,
    enqueue_replay,
    enqueue_run,
    enqueue_trajectory,
    queue_for,
)
from data.replays import Replay
from data.trajectories import Trajectory

ACTIVE = tuple(status.value for status in RUN_ACTIVE)


@dataclass(frozen=True)
class JobKind:
    """One kind of job: its table, its Celery task, the queue of one of its rows, and which of its
    rows count against the per-user caps."""

    name: str
    table: type[Base]
    task: str
    queue_of: Callable[[Any], str]
    send: Callable[[Any], str]  # the row's message, under its token (`data.queue`)
    counted: Callable[[], ColumnElement[bool]] = true

    def active(self) -> Any:
        """SQL: the kind's rows that are queued or running and count against the caps."""
        return select(func.count(self.table.id)).where(self.table.status.in_(ACTIVE), self.counted())


RUNS = JobKind("run", Run, TASK_RUN, lambda row: queue_for(row.model), enqueue_run,
               lambda: Run.sweep_id.is_(None))
TRAJECTORIES = JobKind("trajectory", Trajectory, TASK_TRAJECTORY, lambda row: queue_for(row.model),
                       lambda row: enqueue_trajectory(row.id, row.task_id, row.model))
REPLAYS = JobKind("replay", Replay, TASK_REPLAY, lambda _row: REPLAY_QUEUE,
                  lambda row: enqueue_replay(row.id, row.task_id))
KINDS = (RUNS, TRAJECTORIES, REPLAYS)


def kind_of(row: Base) -> JobKind:
    """The kind of a job's row."""
    for kind in KINDS:
        if isinstance(row, kind.table):
            return kind
    raise TypeError(f"{type(row).__name__} is not a job")


def active_jobs(session: Session, created_by: str | None = None) -> int:
    """Jobs queued or running, of every kind (a sweep's edits excepted), of one user or of all."""
    total = 0
    for kind in KINDS:
        query = kind.active()
        if created_by is not None:
            query = query.where(kind.table.created_by == created_by)
        total += session.scalar(query) or 0
    return total


def finish(row: Any, status: RunStatus, error: str | None = None, stage: str | None = None,
           now: datetime | None = None) -> None:
    """Move a job's row to a final state (its stage says so unless given)."""
    row.status, row.stage, row.finished_at = status.value, stage or status.value, now or utcnow()
    if error is not None:
        row.error = error
