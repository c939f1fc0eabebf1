"""A run's row while a worker has it: claiming it, progress and heartbeats, and the final write.

Every write is conditional on the run still being `running` under this worker: when the web has
flipped it to `cancelled` (or a watchdog to `failed`) the write matches nothing and the task stops
at the next progress point. A message delivered again (acks_late: the worker that had it died) finds
its run `running` under a dead worker, or `failed` by the watchdog, and restarts it cleanly
(partial results deleted). Each write is a short session of its own, so the web side sees progress
while the engine works.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import delete
from sqlalchemy.orm import Session

from data.contracts import MechanismRecord, NotesMap, RunSnapshot
from data.db import get_sessionmaker
from data.models import Run, RunResult, RunStatus, as_utc
from data.settings import get_settings
from data.sweep_edits import SWEEP_ATTEMPTS, lost_twice
from data.watchdog import MESSAGE_LOST, WORKER_LOST, reap_worker
from data.workers import dead_worker_names
from worker import jobs
from worker.sweep_rows import refresh as refresh_sweep

log = logging.getLogger(__name__)

HEARTBEAT_S = jobs.HEARTBEAT_S
PROGRESS_EVERY_S = 0.25  # at most this often a progress write (stage changes always write)
ROW_WAIT_S = 10.0  # how long to wait for a row the web process has not committed yet
LOST = (WORKER_LOST, MESSAGE_LOST)  # failed by the watchdog: a message that turns up restarts the run


class OwnerMaybeAlive(Exception):
    """The run is `running` under another worker that may still be alive."""


class Stop(Exception):
    """The run was cancelled (or reaped) while it ran: stop without writing a result."""


def session() -> Session:
    return get_sessionmaker()()


def now() -> datetime:
    return datetime.now(UTC)


def ms_since(moment: datetime | None, until: datetime) -> float:
    moment = as_utc(moment)
    return 0.0 if moment is None else (until - moment).total_seconds() * 1000


def wait_for(model: type, row_id: int) -> bool:
    """True once the row exists: the web commits after the broker took the message, so a fast
    worker can see the message before the row."""
    deadline = time.monotonic() + ROW_WAIT_S
    while True:
        with session() as s:
            if s.get(model, row_id) is not None:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def reap_own_runs(hostname: str) -> list[int]:
    """At worker start: jobs still `running` under this worker's name are from its previous life
    (a sweep's edits among them are queued again once: `data.sweep_edits`); the runs' ids."""
    with session() as s:
        reaped = reap_worker(s, hostname)
    if reaped:
        log.warning("jobs marked failed (lost in a previous life of this worker)",
                    extra={"worker": hostname, "reaped": reaped.ids})
    return reaped.runs


def claim(run_id: int, hostname: str, task_id: str) -> RunSnapshot | None:
    """Mark the run `running` under this worker and return its snapshot, or None to skip it.

    A message is for one run only: a run that does not exist (deleted, or never saved) or holds
    another token than `task_id` (ids reused before 0006, a stray message) is skipped at once.
    Restarts (deleting partial results) a run a dead worker left `running` or the watchdog
    failed; skips a run that finished or was cancelled. A run `running` under another worker that
    the registry does not (yet) know to be dead raises `OwnerMaybeAlive`: the task asks again
    later, so a redelivered message is not used up while its first worker is only presumed dead."""
    with session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None:
            log.warning("run does not exist (deleted, or never saved): message dropped",
                        extra={"run_id": run_id, "task_id": task_id})
            return None
        if run.task_id and task_id and run.task_id != task_id:
            log.warning("message is not the run's (another token): dropped",
                        extra={"task_id": task_id, "run_id": run_id, "run_token": run.task_id})
            return None
        heartbeat = run.heartbeat_at or run.started_at
        age_s = ms_since(heartbeat, now()) / 1000 if heartbeat else float("inf")
        dead_owner = (run.worker == hostname or age_s > get_settings().heartbeat_max_age_s
                      or run.worker in dead_worker_names(s))
        if run.status == RunStatus.RUNNING and not dead_owner:
            raise OwnerMaybeAlive(f"run {run_id} is running under {run.worker}")
        restart = ((run.status == RunStatus.RUNNING and dead_owner)
                   or (run.status == RunStatus.FAILED and run.error in LOST))
        if run.status != RunStatus.QUEUED and not restart:
            log.info("run already taken: not running it again",
                     extra={"run_id": run_id, "status": str(run.status), "worker": run.worker})
            return None
        if restart and run.sweep_id is not None and (run.attempts or 0) >= SWEEP_ATTEMPTS:
            # a sweep's edit is retried once: lost again, it fails with the reason and the sweep
            # finishes with what it has
            reason = run.error if run.status == RunStatus.FAILED else WORKER_LOST
            run.status, run.stage, run.finished_at = RunStatus.FAILED, "failed", now()
            run.error = lost_twice(reason)
            sweep_id = run.sweep_id
            s.commit()
            refresh_sweep(sweep_id)
            return None
        if restart:
            log.warning("run restarting after its worker was lost",
                        extra={"run_id": run_id, "worker": run.worker})
            s.execute(delete(RunResult).where(RunResult.run_id == run_id))
            run.attribution = None
            run.mechanism = None
        started = now()
        run.status, run.stage, run.progress, run.error = RunStatus.RUNNING, "starting", 0.0, None
        run.worker, run.task_id = hostname, task_id or run.task_id
        run.attempts = (run.attempts or 0) + 1
        run.started_at, run.heartbeat_at, run.finished_at = started, started, None
        run.timings = {"queue_wait_ms": round(ms_since(run.created_at, started), 1)}
        snapshot = run.snapshot
        s.commit()
        return snapshot


def _write_if_ours(run_id: int, hostname: str, **values: Any) -> bool:
    """Update the row if it is still ours and running (through a storage fault: `worker.jobs`);
    False when it is not any more."""
    return jobs.write(Run, run_id, hostname, **values)


class RunReporter:
    """Writes stage/progress to a running run's row and notices cancellation; its heartbeat
    (`worker.jobs.Heartbeat`) writes every `HEARTBEAT_S`, so a long silent stage is not mistaken
    for a dead worker."""

    def __init__(self, run_id: int, hostname: str) -> None:
        self.run_id, self.hostname = run_id, hostname
        self.stage = "starting"
        self._last_write = 0.0
        self._started = time.monotonic()
        self._beat = jobs.Heartbeat(Run, run_id, hostname)

    def __enter__(self) -> RunReporter:
        self._beat.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._beat.__exit__(*exc)

    def progress(self, stage: str, fraction: float) -> None:
        """The engine's progress callback: write (throttled), and stop if the run was cancelled or
        ran past the time limit (the solo pool does not enforce Celery's time limits itself)."""
        if self._beat.stop.is_set():
            raise Stop
        if time.monotonic() - self._started > get_settings().task_time_limit_s:
            raise SoftTimeLimitExceeded()
        moment = time.monotonic()
        if stage == self.stage and moment - self._last_write < PROGRESS_EVERY_S:
            return
        self.stage, self._last_write = stage, moment
        if not _write_if_ours(self.run_id, self.hostname, stage=stage[:64],
                              progress=float(min(max(fraction, 0.0), 1.0))):
            raise Stop


def fail(run_id: int, hostname: str, message: str) -> bool:
    """Mark the run failed with `message`, only if it is still ours and running."""
    return jobs.finish(Run, run_id, hostname, RunStatus.FAILED, stage="failed", error=message)


def succeed(run_id: int, hostname: str, rows: list[RunResult], timings: dict[str, float],
            attribution: NotesMap | None = None, dtype: str | None = None, device: str | None = None,
            mechanism: MechanismRecord | None = None) -> bool:
    """Results (and the notes map, the dtype and device it computed in) and `succeeded` in one
    transaction; nothing is written if the run was cancelled."""
    with session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None or run.status != RunStatus.RUNNING or run.worker != hostname:
            return False
        s.execute(delete(RunResult).where(RunResult.run_id == run_id))
        s.add_all(rows)
        run.status, run.stage, run.progress, run.error = RunStatus.SUCCEEDED, "done", 1.0, None
        run.finished_at = run.heartbeat_at = now()
        run.timings = {**(run.timings or {}), **timings}
        run.attribution = attribution
        run.mechanism = mechanism
        run.dtype, run.device = dtype or None, device or None
        s.commit()
        return True


def stopped(run_id: int) -> None:
    """After a cancellation: drop partial results, stamp the end; the status stays as the web set
    it. A run that was taken from us otherwise (reaped, restarted elsewhere) is left alone."""
    with session() as s:
        run = s.get(Run, run_id)
        if run is not None and run.status == RunStatus.CANCELLED:
            s.execute(delete(RunResult).where(RunResult.run_id == run_id))
            run.stage, run.finished_at = "cancelled", run.finished_at or now()
        s.commit()
