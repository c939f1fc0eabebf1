"""The Celery task `kvnotes.replay`: a serving replay that the web app saved as a `replays` row.

It reads the row's snapshot (the broker carries only the id), marks it running, drives the user's
vLLM server through `serving.replay` with progress written back as it goes, and stores the result;
a replay that fails (the server unreachable or dying mid-replay, a prompt too long) ends as a
`failed` row whose error names the problem and the request, with no result kept. A replay cancelled
while it runs stops at its next request and keeps nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import update

from data.models import RunStatus
from data.replays import Replay, ReplaySnapshot
from serving import ReplayError, ReplaySpec, replay
from worker import run_rows
from worker.celery_app import app

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.5


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


def _claim(replay_id: int, task_id: str | None) -> ReplaySnapshot | None:
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

    def __init__(self, replay_id: int) -> None:
        self.replay_id, self.last = replay_id, 0.0

    def __call__(self, done: int, total: int, variant: str) -> None:
        if done < total and time.monotonic() - self.last < PROGRESS_EVERY_S:
            return
        self.last = time.monotonic()
        if not _write(self.replay_id, stage=f"{variant}: {done}/{total} requests", progress=done / total):
            raise Cancelled(f"replay {self.replay_id} is no longer running: stopped after {done} of "
                            f"{total} requests")


@app.task(name="kvnotes.replay", bind=True)
def replay_task(self, replay_id: int) -> dict[str, Any]:
    """Run the replay `replay_id` and store what it measured (or why it failed)."""
    if not run_rows.wait_for(Replay, replay_id):
        return {"replay_id": replay_id, "status": "missing"}
    snapshot = _claim(replay_id, self.request.id)
    if snapshot is None:
        return {"replay_id": replay_id, "status": "skipped"}
    try:
        result = replay(ReplaySpec.of(snapshot.model_dump()), snapshot.url, snapshot.model or None,
                        on_progress=_Progress(replay_id))
    except Cancelled as exc:
        log.info("%s", exc)
        return {"replay_id": replay_id, "status": "cancelled"}
    except ReplayError as exc:
        _write(replay_id, status=RunStatus.FAILED.value, error=str(exc), finished_at=run_rows.now())
        return {"replay_id": replay_id, "status": "failed", "error": str(exc)}
    except Exception as exc:  # a bug, not the user's input: still a failed row, never silence
        log.exception("replay %s failed", replay_id)
        message = f"the replay stopped on an internal error ({type(exc).__name__}: {exc})"
        _write(replay_id, status=RunStatus.FAILED.value, error=message, finished_at=run_rows.now())
        return {"replay_id": replay_id, "status": "failed", "error": message}
    _write(replay_id, status=RunStatus.SUCCEEDED.value, stage="done", progress=1.0, result=result,
           finished_at=run_rows.now())
    log.info("replay %s succeeded", replay_id)
    return {"replay_id": replay_id, "status": "succeeded"}
