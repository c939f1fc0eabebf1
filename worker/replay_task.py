"""The Celery task `kvnotes.replay`: a serving replay that the web app saved as a `replays` row.

It runs on the replays' own queue (`data.queue.REPLAY_QUEUE`), in a small pool of threads, never on
a model's worker: a replay is HTTP calls. It claims the row (the one job lifecycle's claim, writes
and heartbeat: `worker.jobs`, through storage faults), reads its snapshot, drives the user's
vLLM server through `serving.replay` (a trajectory's snapshot through `serving.replay_trajectory`,
one request per turn) with progress written back as it goes, and stores the result;
a replay that fails (the server unreachable or dying mid-replay, a prompt too long) ends as a
`failed` row whose error names the problem and the request, with no result kept. A replay cancelled
while it runs stops within seconds, mid-answer (its row is watched and the server's streams shut),
and keeps nothing; one past `KVNOTES_REPLAY_DEADLINE` fails saying so.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from data.models import RunStatus
from data.replays import Replay
from data.settings import get_settings
from serving import Bounds, ReplayError, ReplayStopped, replay, replay_trajectory
from vocabulary.replay import TrajectoryReplaySpec
from worker import jobs
from worker.celery_app import app

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.5
WATCH_EVERY_S = 1.0  # how often a running replay's row is read for a cancel


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
    hostname = self.request.hostname or "unknown"
    row = jobs.claim_or_retry(
        self, lambda: jobs.claim(Replay, replay_id, self.request.id, hostname, "starting"), "replay",
        job_id=replay_id)
    if row is None:
        return {"replay_id": replay_id, "status": "skipped"}
    snapshot = row.snapshot
    turns = isinstance(snapshot, TrajectoryReplaySpec)
    progress = _Progress(replay_id, hostname, "turns" if turns else "requests")
    run = replay_trajectory if turns else replay

    def failed(message: str) -> dict[str, Any]:
        jobs.finish(Replay, replay_id, hostname, RunStatus.FAILED, error=message)
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
    jobs.finish(Replay, replay_id, hostname, RunStatus.SUCCEEDED, stage="done", progress=1.0, result=result)
    log.info("replay succeeded", extra={"replay_id": replay_id})
    return {"replay_id": replay_id, "status": "succeeded"}
