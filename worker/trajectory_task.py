"""The Celery task `kvnotes.trajectory`: a trajectory the web app saved as a `trajectories` row.

It claims the queued row that holds its message's token (the broker carries only the id), loads the
model, and runs every turn (`worker.engine.trajectory`), each strategy carrying its own cache; after
each turn the turn's results and `turns_done` are written, so progress is per turn and a cancelled
or failed trajectory keeps the turns it read. Before each turn the row is read: once it is no longer
running (cancelled, or deleted with its notebook) the trajectory stops there. A refusal of the engine
(a prompt past the model's context at some turn, named with its length) fails the row with that
sentence before any turn runs. The skills the turns place are read from the KV store where their
rows keep compiled notes for the same text (`worker.mapping.stored_skill_notes`), else compiled
before the first turn.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import select, update

from data.models import RunStatus
from data.trajectories import Trajectory
from vocabulary.trajectories import TrajectorySpec, TurnRecord
from worker import run_rows
from worker.celery_app import app
from worker.engine import EngineError
from worker.engine.trajectory import request_of, trajectory
from worker.mapping import stored_skill_notes
from worker.runtime import describe_failure, get_engine

log = logging.getLogger(__name__)


def _write(trajectory_id: int, **values: Any) -> bool:
    """Update the row while it is still running; False when it was not (cancelled or deleted)."""
    with run_rows.session() as s:
        changed = s.execute(update(Trajectory).where(Trajectory.id == trajectory_id,
                                                     Trajectory.status == RunStatus.RUNNING.value)
                            .values(**values)).rowcount
        s.commit()
    return bool(changed)


def _claim(trajectory_id: int, task_id: str | None) -> TrajectorySpec | None:
    """Mark the queued trajectory that holds this message's token running; None when there is none."""
    with run_rows.session() as s:
        row = s.get(Trajectory, trajectory_id)
        if row is None or row.status != RunStatus.QUEUED.value or (task_id and row.task_id != task_id):
            return None
        row.status, row.stage, row.started_at = RunStatus.RUNNING.value, "loading model", run_rows.now()
        spec = row.spec
        s.commit()
    return spec


def _running(trajectory_id: int) -> bool:
    with run_rows.session() as s:
        status = s.scalar(select(Trajectory.status).where(Trajectory.id == trajectory_id))
    return status == RunStatus.RUNNING.value


@app.task(name="kvnotes.trajectory", bind=True)
def trajectory_task(self, trajectory_id: int) -> dict[str, Any]:
    """Run the trajectory `trajectory_id`, writing each turn as it is read."""
    spec = _claim(trajectory_id, self.request.id)
    if spec is None:
        return {"trajectory_id": trajectory_id, "status": "skipped"}
    t0 = time.perf_counter()
    turns: list[TurnRecord] = []
    total = len(spec.turns)
    device, stage = "?", "loading model"

    def progress(index: int, turn: TurnRecord) -> None:
        turns.append(turn)
        _write(trajectory_id, turns=list(turns), turns_done=len(turns), progress=len(turns) / total,
               stage=f"turn {len(turns)} of {total}")

    try:
        eng = get_engine(spec.model)
        device, stage = str(eng.device), "prefill"
        _write(trajectory_id, stage="prefill")
        stored = {s.name: stored_skill_notes(eng, s.skill_id, s.text) for s in spec.skills}
        request = request_of(spec, {name: notes for name, notes in stored.items() if notes is not None})
        trajectory(eng, request, progress=progress, cancelled=lambda: not _running(trajectory_id))
    except Exception as exc:
        if not isinstance(exc, EngineError):
            log.exception("trajectory failed", extra={"trajectory_id": trajectory_id, "stage": stage})
        message = describe_failure(exc, device, stage)
        _write(trajectory_id, status=RunStatus.FAILED.value, error=message, finished_at=run_rows.now())
        return {"trajectory_id": trajectory_id, "status": "failed", "error": message}
    if not _write(trajectory_id, status=RunStatus.SUCCEEDED.value, stage="done", progress=1.0,
                  finished_at=run_rows.now()):
        log.info("trajectory stopped", extra={"trajectory_id": trajectory_id, "turns": len(turns)})
        return {"trajectory_id": trajectory_id, "status": "cancelled"}
    log.info("trajectory succeeded", extra={"trajectory_id": trajectory_id,
                                            "duration_ms": round((time.perf_counter() - t0) * 1000)})
    return {"trajectory_id": trajectory_id, "status": "succeeded"}
