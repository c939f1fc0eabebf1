"""The Celery task `kvnotes.replay`: a serving replay that the web app saved as a `replays` row.

It reads the row's snapshot (the broker carries only the id), marks it running, drives the user's
vLLM server through `serving.replay` (a trajectory's snapshot through `serving.replay_trajectory`,
one request per turn) with progress written back as it goes, and stores the result;
a replay that fails (the server unreachable or dying mid-replay, a prompt too long) ends as a
`failed` row whose error names the problem and the request, with no result kept. A replay cancelled
while it runs stops within seconds, mid-answer (its row is watched and the server's streams shut),
and keeps nothing; one past `KVNOTES_REPLAY_DEADLINE` fails saying so.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import select, update

from data.models import RunStatus
from data.replays import Replay
from data.settings import get_settings
from serving import Bounds, ReplayError, ReplayStopped, replay, replay_trajectory
from vocabulary.replay import ReplaySpec, TrajectoryReplaySpec
from worker import run_rows
from worker.celery_app import app

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.5
WATCH_EVERY_S = 1.0  # how often a running replay's row is read for a cancel


class Cancelled(Exception):
    """The replay's row is no longer running (cancelled, or deleted with its notebook)."""


def _write(replay_id: int, only_running: bool = True, **values: Any) -> bool:
    """Update the row (while it is still running, unless told otherwise); False when it was not."""
    with run_rows.session() as s:
        query = update(Replay).where(Replay.id == replay_id)
        if only_running:
            query = query.where(Replay.status == RunStatus.RUNNING.value)
        changed = s.execute(query.values(**values)).rowcount
        s.commit()
    return bool(changed)


def _claim(replay_id: int, task_id: str | None) -> ReplaySpec | TrajectoryReplaySpec | None:
    """Mark the queued replay that holds this message's token running; None when there is none."""
    with run_rows.session() as s:
        row = s.get(Replay, replay_id)
        if row is None or row.status != RunStatus.QUEUED.value or (task_id and row.task_id != task_id):
            return None
        row.status, row.stage, row.started_at = RunStatus.RUNNING.value, "starting", run_rows.now()
        snapshot = row.snapshot
        s.commit()
    return snapshot


class _Progress:
    """Writes `stage` and `progress` at most every PROGRESS_EVERY_S (always the last request), and
    stops the replay when its row is no longer running."""

    def __init__(self, replay_id: int, unit: str = "requests") -> None:
        self.replay_id, self.last, self.unit = replay_id, 0.0, unit
        self.done = self.total = 0  # requests answered so far, of all the replay sends

    def __call__(self, done: int, total: int, variant: str) -> None:
        self.done, self.total = done, total
        if done < total and time.monotonic() - self.last < PROGRESS_EVERY_S:
            return
        self.last = time.monotonic()
        if not _write(self.replay_id, stage=f"{variant}: {done}/{total} {self.unit}", progress=done / total):
            raise Cancelled(f"replay {self.replay_id} is no longer running: stopped after {done} of "
                            f"{total} requests")


class _Watch:
    """Sets `stop` once the replay's row is no longer running (cancelled, or deleted with its
    notebook), looking every WATCH_EVERY_S while the replay runs: the server's streams are shut then,
    mid-answer (`serving.Server`), so a cancelled replay frees its worker within seconds."""

    def __init__(self, replay_id: int) -> None:
        self.replay_id, self.stop, self._done = replay_id, threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"replay-{replay_id}-watch", daemon=True)

    def _run(self) -> None:
        while not self._done.wait(WATCH_EVERY_S):
            try:
                with run_rows.session() as s:
                    status = s.scalar(select(Replay.status).where(Replay.id == self.replay_id))
            except Exception as exc:  # the database busy or gone a moment: look again
                log.info("replay: cannot read its status",
                         extra={"replay_id": self.replay_id, "reason": type(exc).__name__})
                continue
            if status != RunStatus.RUNNING.value:
                self.stop.set()
                return

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()


def bounds() -> Bounds:
    """A replay's bounds from settings: `KVNOTES_REPLAY_DEADLINE` in all, `KVNOTES_REPLAY_REQUEST_TIMEOUT`
    per answer, and never the app's own database or broker ports."""
    settings = get_settings()
    return Bounds(connect_s=10.0, request_s=settings.replay_request_s, replay_s=settings.replay_deadline_s,
                  refused_ports=tuple(settings.service_ports))


@app.task(name="kvnotes.replay", bind=True)
def replay_task(self, replay_id: int) -> dict[str, Any]:
    """Run the replay `replay_id` and store what it measured (or why it failed). The row is
    committed before its message is sent, so a message without its row (the notebook deleted while
    the replay was queued) or for another token is dropped at once."""
    snapshot = _claim(replay_id, self.request.id)
    if snapshot is None:
        return {"replay_id": replay_id, "status": "skipped"}
    turns = isinstance(snapshot, TrajectoryReplaySpec)
    progress = _Progress(replay_id, "turns" if turns else "requests")
    run = replay_trajectory if turns else replay
    try:
        with _Watch(replay_id) as watch:
            result = run(snapshot, snapshot.url, snapshot.model or None,  # type: ignore[arg-type]
                         on_progress=progress, bounds=bounds(), stop=watch.stop)
    except (Cancelled, ReplayStopped) as exc:
        if isinstance(exc, Cancelled) or watch.stop.is_set():
            log.info("replay stopped", extra={"replay_id": replay_id, "reason": str(exc),
                                              "done": progress.done, "total": progress.total})
            return {"replay_id": replay_id, "status": "cancelled"}
        message = f"{exc} (KVNOTES_REPLAY_DEADLINE); nothing of it is kept"
        _write(replay_id, status=RunStatus.FAILED.value, error=message, finished_at=run_rows.now())
        return {"replay_id": replay_id, "status": "failed", "error": message}
    except ReplayError as exc:
        _write(replay_id, status=RunStatus.FAILED.value, error=str(exc), finished_at=run_rows.now())
        return {"replay_id": replay_id, "status": "failed", "error": str(exc)}
    except Exception as exc:  # a bug, not the user's input: still a failed row, never silence
        log.exception("replay failed", extra={"replay_id": replay_id})
        message = f"the replay stopped on an internal error ({type(exc).__name__}: {exc})"
        _write(replay_id, status=RunStatus.FAILED.value, error=message, finished_at=run_rows.now())
        return {"replay_id": replay_id, "status": "failed", "error": message}
    _write(replay_id, status=RunStatus.SUCCEEDED.value, stage="done", progress=1.0, result=result,
           finished_at=run_rows.now())
    log.info("replay succeeded", extra={"replay_id": replay_id})
    return {"replay_id": replay_id, "status": "succeeded"}
