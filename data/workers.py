"""Which workers are alive, what they serve, and whether they are busy: one row per worker start.

A worker registers when it starts (`workers.name` is its Celery node name, unique per start; `queues`
the model queues it consumes, `model.<alias>` as `data.queue.queue_for` names them), beats
every few seconds, says when it takes and finishes a task, and marks itself stopped on a clean
shutdown; `kvnotes serve` marks its worker stopped the moment it sees it die. A worker whose beat is
older than `worker_stale_s` is dead (beats are written and read on the database's clock,
`data.models.db_now`: never two hosts' clocks), and so is one on this machine whose process is gone
(a `kill -9` of `serve` takes its worker with it: its last beat must not count for the next
`serve`). The web
app reads this table for `/api/health` ("a live worker per offered model") and to tell a person
that their run waits for a model nobody serves; the watchdog (`data.watchdog`) uses it to fail the
runs of dead workers at once, and to find queued runs whose message is gone (a live worker of their
model has sat idle since long after they were queued).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from sqlalchemy import JSON, DateTime, Integer, String, delete, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from data.models import Base, as_utc, db_now, utcnow
from data.queue import queue_for
from data.settings import get_settings

FORGET_AFTER = timedelta(days=1)  # rows of workers stopped or dead this long ago are deleted


class Worker(Base):
    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    queues: Mapped[list[str]] = mapped_column(JSON)
    host: Mapped[str] = mapped_column(String(200), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    beat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # the run it works on (None: none); idle_since is None while it starts or works
    running_run_id: Mapped[int | None] = mapped_column(Integer)
    idle_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # what it does before it can take a run ("loading tiny-llama", "converting smollm2-135m"); None: ready
    starting: Mapped[str | None] = mapped_column(String(200))

    def is_live(self, now: datetime, stale_s: float) -> bool:
        beat = as_utc(self.beat_at)
        recent = self.stopped_at is None and beat is not None and (now - beat).total_seconds() < stale_s
        return recent and not self.process_gone()

    def process_gone(self) -> bool:
        """True when the worker ran on this machine and its process no longer exists."""
        return self.host == socket.gethostname()[:200] and self.pid > 0 and not pid_alive(self.pid)

    def idle_for(self, now: datetime) -> float:
        """Seconds it has been idle (0 while starting or busy)."""
        idle = as_utc(self.idle_since)
        return 0.0 if idle is None or self.running_run_id is not None else (now - idle).total_seconds()


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def register(session: Session, name: str, queues: list[str], host: str, pid: int,
             starting: str | None = None) -> bool:
    """Record a worker: starting (`starting` says what it does until it is ready, as a worker
    says at its start) or ready (None: registering again after its row could not be written).
    False when a LIVE worker of another process already has this name (a duplicate `--name`): the
    caller must then not treat runs under the name as its own."""
    now = db_now(session)
    row = session.get(Worker, name)
    duplicate = row is not None and row.pid != pid and row.is_live(now, get_settings().worker_stale_s)
    if row is None:
        row = Worker(name=name)
        session.add(row)
    row.queues, row.host, row.pid = list(queues), host[:200], pid
    row.started_at = row.beat_at = now
    row.running_run_id = row.idle_since = row.stopped_at = None
    row.starting = starting[:200] if starting else None
    session.flush()
    return not duplicate


def beat(session: Session, name: str) -> bool:
    """The worker is alive; False when it has no live row to beat (never registered, or marked
    stopped while the database could not hear it): it must register again."""
    alive = update(Worker).where(Worker.name == name, Worker.stopped_at.is_(None))
    return session.execute(alive.values(beat_at=db_now(session))).rowcount > 0


def set_starting(session: Session, name: str, what: str) -> None:
    """The worker is still getting ready: `what` it does ("converting smollm2-135m")."""
    session.execute(update(Worker).where(Worker.name == name).values(starting=what[:200],
                                                                     beat_at=db_now(session)))


def set_running(session: Session, name: str, run_id: int | None) -> None:
    """The worker took a task (`run_id`, or 0 for a task that is not a run) or finished it (None)."""
    now = db_now(session)
    session.execute(
        update(Worker).where(Worker.name == name).values(
            running_run_id=run_id, idle_since=None if run_id is not None else now, beat_at=now,
            starting=None,
        )
    )


def mark_stopped(session: Session, name: str) -> None:
    stopped = update(Worker).where(Worker.name == name)
    session.execute(stopped.values(stopped_at=db_now(session), running_run_id=None))


def live_workers(session: Session, now: datetime | None = None) -> list[Worker]:
    """The workers whose beat is recent by the database's clock (or `now`) and not stopped."""
    now = now or db_now(session)
    stale_s = get_settings().worker_stale_s
    cutoff = now - timedelta(seconds=stale_s)
    rows = session.scalars(select(Worker).where(Worker.stopped_at.is_(None), Worker.beat_at >= cutoff))
    return [row for row in rows if row.is_live(now, stale_s)]


def dead_worker_names(session: Session, now: datetime | None = None) -> set[str]:
    """Names of workers that stopped or stopped beating (rows kept for a day)."""
    now = now or db_now(session)
    stale_s = get_settings().worker_stale_s
    return {row.name for row in session.scalars(select(Worker)) if not row.is_live(now, stale_s)}


def models_without_worker(session: Session, models: list[str]) -> list[str]:
    """Those of `models` that no live worker serves."""
    served = {q for row in live_workers(session) for q in row.queues}
    return [m for m in models if queue_for(m) not in served]


def models_starting(session: Session, models: list[str]) -> dict[str, str]:
    """Those of `models` served only by live workers still getting ready, each with what its worker
    does ("converting smollm2-135m"): a run of theirs could not start yet."""
    live = live_workers(session)
    ready = {q for row in live if not row.starting for q in row.queues}
    out: dict[str, str] = {}
    for model in models:
        queue = queue_for(model)
        doing = [row.starting for row in live if row.starting and queue in row.queues]
        if doing and queue not in ready:
            out[model] = doing[0]
    return out


def forget_old(session: Session, now: datetime | None = None) -> None:
    """Delete rows of workers dead or stopped for more than a day."""
    cutoff = (now or db_now(session)) - FORGET_AFTER
    session.execute(delete(Worker).where(Worker.beat_at < cutoff))
