"""The Celery task `kvnotes.trajectory`: a trajectory the web app saved as a `trajectories` row.

It claims the queued row that holds its message's token (the broker carries only the id; the claim,
the writes and the heartbeat are the one job lifecycle's: `worker.jobs`, through storage faults),
loads the model, and runs every turn (`worker.engine.trajectory`), each strategy carrying its own
cache; after each turn the turn's results and `turns_done` are written, so progress is per turn and
a cancelled or failed trajectory keeps the turns it read. Its row is watched while it runs: once it
is no longer running (cancelled, reaped, or deleted with its notebook) the trajectory stops before
its next turn, and so is one past its deadline (`KVNOTES_JOB_DEADLINE_S`), failed saying so (one
stuck inside a turn is failed by the reaper, and its worker replaced by its supervisor). A refusal
of the engine
(a prompt past the model's context at some turn, named with its length) fails the row with that
sentence before any turn runs. The skills the turns place are read from the KV store where their
rows keep compiled notes for the same text (`worker.mapping.stored_skill_notes`), else compiled
before the first turn.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from data.jobs import TRAJECTORIES, deadline_message, deadline_s
from data.models import RunStatus
from data.trajectories import Trajectory
from vocabulary.trajectories import TurnRecord
from worker import jobs
from worker.celery_app import app
from worker.engine import EngineError
from worker.engine.trajectory import request_of, trajectory
from worker.mapping import stored_skill_notes, unowned_job_store
from worker.runtime import describe_failure, get_engine

log = logging.getLogger(__name__)
WATCH_S = 1.0  # how often a running trajectory's row is read for a cancel (between turns)


class PastDeadline(Exception):
    """The trajectory ran past its deadline (`data.jobs.deadline_s`)."""


def _write(trajectory_id: int, hostname: str, **values: Any) -> bool:
    """Update the row while it is still running under this worker; False when it is not."""
    return jobs.write(Trajectory, trajectory_id, hostname, **values)


@app.task(name="kvnotes.trajectory", bind=True)
def trajectory_task(self, trajectory_id: int) -> dict[str, Any]:
    """Run the trajectory `trajectory_id`, writing each turn as it is read."""
    hostname = self.request.hostname or "unknown"
    row = jobs.claim_or_retry(self, lambda: jobs.claim(TRAJECTORIES, trajectory_id, self.request.id, hostname,
                                                       "loading model"), "trajectory", job_id=trajectory_id)
    if row is None:
        return {"trajectory_id": trajectory_id, "status": "skipped"}
    spec = row.spec
    t0 = time.perf_counter()
    turns: list[TurnRecord] = []
    total = len(spec.turns)
    device, stage = "?", "loading model"
    beat = jobs.Heartbeat(Trajectory, trajectory_id, hostname, watch_s=WATCH_S,
                          deadline_s=deadline_s(TRAJECTORIES))

    def stopping() -> bool:  # asked by the engine between steps: cancelled, reaped, or past the deadline
        return beat.check_deadline() or beat.stop.is_set()

    def progress(index: int, turn: TurnRecord) -> None:
        turns.append(turn)
        if not _write(trajectory_id, hostname, turns=list(turns), turns_done=len(turns),
                      progress=len(turns) / total, stage=f"turn {len(turns)} of {total}"):
            beat.stop.set()  # cancelled (or reaped): no next turn

    try:
        with beat:
            eng = get_engine(spec.model, say=lambda said: _write(trajectory_id, hostname, stage=said[:64]))
            device, stage = str(eng.device), "prefill"
            _write(trajectory_id, hostname, stage="prefill")
            with unowned_job_store(eng):  # KVNOTES_STORE_SCOPE=user: a trajectory records no user
                stored = {s.name: stored_skill_notes(eng, s.skill_id, s.text) for s in spec.skills}
                request = request_of(spec, {n: notes for n, notes in stored.items() if notes is not None})
                trajectory(eng, request, progress=progress, cancelled=stopping)
            if len(turns) < total and beat.check_deadline():  # stopped by it, not done
                raise PastDeadline(deadline_message(TRAJECTORIES, f"turn {len(turns) + 1} of {total}"))
    except PastDeadline as exc:
        log.warning("trajectory stopped: past its deadline", extra={"trajectory_id": trajectory_id})
        if not jobs.finish(Trajectory, trajectory_id, hostname, RunStatus.FAILED, error=str(exc),
                           stage="failed"):
            return {"trajectory_id": trajectory_id,
                    "status": jobs.lost(Trajectory, trajectory_id, RunStatus.FAILED)}
        return {"trajectory_id": trajectory_id, "status": "failed", "error": str(exc)}
    except Exception as exc:
        if not isinstance(exc, EngineError):
            log.exception("trajectory failed", extra={"trajectory_id": trajectory_id, "stage": stage})
        message = describe_failure(exc, device, stage)
        if not jobs.finish(Trajectory, trajectory_id, hostname, RunStatus.FAILED, error=message):
            return {"trajectory_id": trajectory_id,
                    "status": jobs.lost(Trajectory, trajectory_id, RunStatus.FAILED)}
        return {"trajectory_id": trajectory_id, "status": "failed", "error": message}
    if not jobs.finish(Trajectory, trajectory_id, hostname, RunStatus.SUCCEEDED, stage="done", progress=1.0):
        return {"trajectory_id": trajectory_id,
                "status": jobs.lost(Trajectory, trajectory_id, RunStatus.SUCCEEDED, turns=len(turns))}
    log.info("trajectory succeeded", extra={"trajectory_id": trajectory_id,
                                            "duration_ms": round((time.perf_counter() - t0) * 1000)})
    return {"trajectory_id": trajectory_id, "status": "succeeded"}
