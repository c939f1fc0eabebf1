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
- **Lost**: the one reaper (`data.watchdog.reap`, run by the workers' reaper thread and by
  `kvnotes serve`, never by a read) fails a job whose own heartbeat went silent, whose message was
  lost or that ran past its deadline (`deadline_s`); it is the one place a lost job is queued again.

**Every change of state is one conditional statement** (`transition`): `UPDATE … WHERE id = :id AND
status IN (:from_states)`, which returns whether it changed the row. Cancel, the reaper, the claim,
progress, success, failure and a sweep's own state all go through it, so of two writers racing (a
cancel and a success, a reaper and a fresh heartbeat) exactly one wins and the other is told so;
nothing is overwritten. It relies on no row lock (`FOR UPDATE`, which SQLite ignores): SQLite runs
one writer at a time, and PostgreSQL re-checks the WHERE clause of an UPDATE that waited for another.

Each kind is a `JobKind`: its table, its task, the queue it goes to, and which of its rows count
against the per-user caps (a sweep's edits have the sweep's cap instead). The caps count every
kind together (`active_jobs`): one user's replays and runs share that user's cap.

Pure database work on the caller's session (the caller commits); no torch, no worker tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select, true, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from data.models import RUN_ACTIVE, RUN_FINISHED, Base, Run, RunStatus, Sweep, utcnow
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
FINISHED = tuple(status.value for status in RUN_FINISHED)
QUEUED, RUNNING = RunStatus.QUEUED.value, RunStatus.RUNNING.value


@dataclass(frozen=True)
class JobKind:
    """One kind of job: its table, its Celery task, the queue of one of its rows, and which of its
    rows count against the per-user caps."""

    name: str
    table: type[Base]
    task: str = ""  # a sweep has no task of its own: its edits are runs
    queue_of: Callable[[Any], str] | None = None
    send: Callable[[Any], str] | None = None  # the row's message, under its token (`data.queue`)
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
KINDS = (RUNS, TRAJECTORIES, REPLAYS)  # the kinds a worker runs (claim, heartbeat, reaper)
SWEEPS = JobKind("sweep", Sweep)  # its own state, cap and cancel; its edits are RUNS


def deadline_s(kind: JobKind) -> float:
    """How long a job of `kind` may run (from its claim) before it is failed and its worker freed:
    `KVNOTES_JOB_DEADLINE_S` for its kind ("trajectory=600"), else for every kind ("3600"), else
    `KVNOTES_TASK_TIME_LIMIT`; a replay not named there has `KVNOTES_REPLAY_DEADLINE`, which bounds
    its HTTP calls too."""
    from data.settings import get_settings  # (settings import nothing of this module)

    settings = get_settings()
    deadlines = settings.job_deadlines_s
    if kind.name in deadlines:
        return deadlines[kind.name]
    if kind is REPLAYS:
        return settings.replay_deadline_s
    return deadlines.get("*", float(settings.task_time_limit_s))


STUCK = "it did not come back from that step, so its worker is replaced"


def deadline_message(kind: JobKind, stage: str | None = None, stuck: bool = False) -> str:
    """What a job failed past its deadline says (`stuck`: failed by the reaper, its task hung in
    a step; the supervisor of its worker replaces the worker on reading it)."""
    setting = "KVNOTES_REPLAY_DEADLINE" if kind is REPLAYS else "KVNOTES_JOB_DEADLINE_S"
    during = f" during {stage}" if stage else ""
    how = STUCK if stuck else "it was stopped and its worker freed"
    return (f"the {kind.name} ran past its deadline of {deadline_s(kind):g} s ({setting}){during}: "
            f"{how}; start it again with less to do, or raise the deadline")


def transition(session: Session, kind: JobKind | type[Base], job_id: int, from_states: Iterable[str],
               to: str | None = None, *, where: Iterable[ColumnElement[bool]] = (), **values: Any) -> bool:
    """Move the row `job_id` of `kind` to status `to` (None: keep its status, write `values` only)
    with `values`, only while it is still in one of `from_states` (and matches `where`): one
    `UPDATE … WHERE status IN …`. True when it did; False when the row was gone or had moved on (a
    caller that lost the race must say so and write nothing else). A final status stamps
    `finished_at` and, unless given, the stage. The caller commits; a row of the session's identity
    map is expired, so it reads what was written."""
    table = kind.table if isinstance(kind, JobKind) else kind
    states = tuple(str(state) for state in from_states)
    if to is not None:
        values["status"] = str(to)
        if str(to) in FINISHED:
            values.setdefault("finished_at", utcnow())
            if hasattr(table, "stage"):  # (a sweep has none)
                values.setdefault("stage", str(to))
    statement = (update(table).where(table.id == job_id, table.status.in_(states), *where).values(**values)
                 .execution_options(synchronize_session=False))
    moved = session.execute(statement).rowcount == 1
    if moved:
        loaded = session.identity_map.get(identity_key(table, job_id))
        if loaded is not None:
            session.expire(loaded)
    return moved


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


def finish(session: Session, kind: JobKind, job_id: int, status: RunStatus, error: str | None = None,
           from_states: Iterable[str] = ACTIVE, now: datetime | None = None,
           where: Iterable[ColumnElement[bool]] = (), **values: Any) -> bool:
    """Move an unfinished job to a final state with `error` (`transition`); False when it had
    already finished (or moved on from `from_states`)."""
    if error is not None:
        values["error"] = error
    return transition(session, kind, job_id, from_states, status.value, where=where,
                      finished_at=now or utcnow(), **values)
