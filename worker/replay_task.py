"""The Celery task `kvnotes.replay`: a serving replay that the web app saved as a `replays` row.

It runs on the replays' own queue (`data.queue.REPLAY_QUEUE`), in a small pool of threads, never on
a model's worker: a replay is HTTP calls. It claims the row (the one job lifecycle's claim, writes
and heartbeat: `worker.jobs`, through storage faults), reads its snapshot, drives the user's
vLLM server through `serving.replay` (a trajectory's snapshot through `serving.replay_trajectory`,
one request per turn) with progress written back as it goes, and stores the result;
a replay that fails (the server unreachable or dying mid-replay, a prompt too long) ends as a
`failed` row whose error names the problem and the request, with no result kept. A replay cancelled
while it runs stops within seconds, mid-answer (its row is watched and the server's streams shut),
and keeps nothing; one past `KVNOTES_REPLAY_DEADLINE` fails saying so, and its thread is free.

The threads are shared fairly across users (`FairShare`): a user's next replay is taken only while
that user holds fewer than half of them; otherwise its message goes back to the queue for a few
seconds (its row's heartbeat written: a worker saw it, so the reaper does not fail it as a message
nobody took) and the thread serves the next message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from data.db import get_sessionmaker
from data.jobs import REPLAYS, deadline_s
from data.models import RunStatus
from data.queue import REPLAY_QUEUE
from data.replays import Replay
from data.settings import get_settings
from serving import Bounds, ReplayError, ReplayStopped, replay, replay_trajectory
from vocabulary.replay import TrajectoryReplaySpec
from worker import jobs
from worker.celery_app import app

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.5
WATCH_EVERY_S = 1.0  # how often a running replay's row is read for a cancel
DEFER_S = 2.0  # how long a replay waits, off the threads, while its user holds half of them


class Cancelled(Exception):
    """The replay's row is no longer running (cancelled, or deleted with its notebook)."""


class _Progress:
    """Writes `stage` and `progress` at most every PROGRESS_EVERY_S (always the last request), and
    stops the replay when its row is no longer running."""

    def __init__(self, replay_id: int, hostname: str, unit: str = "requests") -> None:
        self.replay_id, self.hostname, self.last, self.unit = replay_id, hostname, 0.0, unit
        self.done = self.total = 0  # requests answered so far, of all the replay sends

    def __call__(self, done: int, total: int, variant: str) -> None:
        self.done, self.total = done, total
        if done < total and time.monotonic() - self.last < PROGRESS_EVERY_S:
            return
        self.last = time.monotonic()
        stage = f"{variant}: {done}/{total} {self.unit}"
        if not jobs.write(Replay, self.replay_id, self.hostname, stage=stage, progress=done / total):
            raise Cancelled(f"replay {self.replay_id} is no longer running: stopped after {done} of "
                            f"{total} requests")


def bounds() -> Bounds:
    """A replay's bounds from settings: its deadline in all (`data.jobs.deadline_s`:
    `KVNOTES_JOB_DEADLINE_S` "replay=…", else `KVNOTES_REPLAY_DEADLINE`), `KVNOTES_REPLAY_REQUEST_TIMEOUT`
    per answer, and never the app's own database or broker ports."""
    settings = get_settings()
    return Bounds(connect_s=10.0, request_s=settings.replay_request_s, replay_s=deadline_s(REPLAYS),
                  refused_ports=tuple(settings.service_ports))


class FairShare:
    """The replays' thread pool shared fairly across users: a user's next replay is taken only
    while that user holds fewer than half the threads (`KVNOTES_REPLAY_THREADS`; at least one), so
    eight replays hung on one user's server leave the other half to everyone else. Counted in
    this process, whose threads are the pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holding: Counter[str] = Counter()

    def share(self) -> int:
        return max(1, get_settings().replay_threads // 2)

    def take(self, owner: str) -> bool:
        with self._lock:
            if self._holding[owner] >= self.share():
                return False
            self._holding[owner] += 1
            return True

    def give_back(self, owner: str) -> None:
        with self._lock:
            self._holding[owner] -= 1


fair_share = FairShare()


def _owner(replay_id: int) -> str:
    """Who asked for the replay ("" when the row is gone or cannot be read now: its claim decides)."""
    try:
        with get_sessionmaker()() as session:
            return session.scalar(select(Replay.created_by).where(Replay.id == replay_id)) or ""
    except SQLAlchemyError:
        return ""


@app.task(name="kvnotes.replay", bind=True)
def replay_task(self, replay_id: int) -> dict[str, Any]:
    """Run the replay `replay_id` and store what it measured (or why it failed). The row is
    committed before its message is sent, so a message without its row (the notebook deleted while
    the replay was queued) or for another token is dropped at once."""
    owner = _owner(replay_id)
    if not fair_share.take(owner):
        # this user already holds half the threads: the message goes back (same token, a few seconds
        # on), and this thread takes the next one, another user's; the row says a worker saw it, so
        # the reaper never fails it as a message no worker took
        jobs.held_back(REPLAYS, replay_id, self.request.id)
        self.apply_async(kwargs={"replay_id": replay_id}, countdown=DEFER_S, task_id=self.request.id,
                         queue=REPLAY_QUEUE)
        return {"replay_id": replay_id, "status": "deferred"}
    try:
        return _run(self, replay_id)
    finally:
        fair_share.give_back(owner)


def _run(self, replay_id: int) -> dict[str, Any]:
    hostname = self.request.hostname or "unknown"
    row = jobs.claim_or_retry(
        self, lambda: jobs.claim(REPLAYS, replay_id, self.request.id, hostname, "starting"), "replay",
        job_id=replay_id)
    if row is None:
        return {"replay_id": replay_id, "status": "skipped"}
    snapshot = row.snapshot
    turns = isinstance(snapshot, TrajectoryReplaySpec)
    progress = _Progress(replay_id, hostname, "turns" if turns else "requests")
    run = replay_trajectory if turns else replay

    def failed(message: str) -> dict[str, Any]:
        if not jobs.finish(Replay, replay_id, hostname, RunStatus.FAILED, error=message):
            return {"replay_id": replay_id, "status": jobs.lost(Replay, replay_id, RunStatus.FAILED)}
        return {"replay_id": replay_id, "status": "failed", "error": message}

    try:
        with jobs.Heartbeat(Replay, replay_id, hostname, watch_s=WATCH_EVERY_S) as watch:
            result = run(snapshot, snapshot.url, snapshot.model or None,  # type: ignore[arg-type]
                         on_progress=progress, bounds=bounds(), stop=watch.stop)
    except (Cancelled, ReplayStopped) as exc:
        if isinstance(exc, Cancelled) or watch.stop.is_set():
            log.info("replay stopped", extra={"replay_id": replay_id, "reason": str(exc),
                                              "done": progress.done, "total": progress.total})
            return {"replay_id": replay_id, "status": "cancelled"}
        return failed(f"{exc} (KVNOTES_REPLAY_DEADLINE); nothing of it is kept")
    except ReplayError as exc:
        return failed(str(exc))
    except Exception as exc:  # a bug, not the user's input: still a failed row, never silence
        log.exception("replay failed", extra={"replay_id": replay_id})
        return failed(f"the replay stopped on an internal error ({type(exc).__name__}: {exc})")
    if not jobs.finish(Replay, replay_id, hostname, RunStatus.SUCCEEDED, stage="done", progress=1.0,
                       result=result):  # cancelled (or reaped, deleted) after its last request
        return {"replay_id": replay_id, "status": jobs.lost(Replay, replay_id, RunStatus.SUCCEEDED)}
    log.info("replay succeeded", extra={"replay_id": replay_id})
    return {"replay_id": replay_id, "status": "succeeded"}
