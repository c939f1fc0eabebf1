"""A run's row while a worker has it: the claim (with its restart hook), progress and heartbeats,
and the final write — the one job lifecycle's (`worker.jobs`), as for trajectories and replays.

Every write is a conditional transition on the run still being `running` under this worker: when the
web has moved it to `cancelled` (or the reaper to `failed`, or queued it again) the write matches
nothing and the task stops at the next progress point. A message whose run is not queued under its
token is dropped at the claim: a lost run is queued again only by the reaper (`data.watchdog.lose`),
under a fresh token. The success write stores the results and `succeeded` in one transaction, tried
through a storage fault like every job's outcome. Each write is a short session of its own, so the
web side sees progress while the engine works.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from data.contracts import MechanismRecord, NotesMap, RunSnapshot, StoreReuse
from data.db import get_sessionmaker
from data.jobs import RUNS, deadline_message, deadline_s
from data.models import Run, RunResult, RunStatus, as_utc
from data.watchdog import reap_worker
from worker import jobs

log = logging.getLogger(__name__)

HEARTBEAT_S = jobs.HEARTBEAT_S
PROGRESS_EVERY_S = 0.25  # at most this often a progress write (stage changes always write)
ROW_WAIT_S = 10.0  # how long to wait for a row the web process has not committed yet


class Stop(Exception):
    """The run was cancelled (or reaped) while it ran: stop without writing a result."""


class PastDeadline(Exception):
    """The run ran past its deadline (`data.jobs.deadline_s`): it is failed saying so."""


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


def claim(run_id: int, hostname: str, task_id: str | None) -> RunSnapshot | None:
    """Mark the queued run that holds the token `task_id` `running` under this worker
    (`worker.jobs.claim`, with `restart` in the same transaction) and return its snapshot, or None
    to skip it: a run that does not exist (deleted, or never saved), holds another token (a message
    the reaper replaced, or delivered again by the broker), or is no longer queued (cancelled,
    finished, taken) is not run."""
    row = jobs.claim(RUNS, run_id, task_id, hostname, "starting", on_claim=restart)
    return None if row is None else row.snapshot


def restart(s: Session, run: Run) -> None:
    """The run's restart hook, in its claim's transaction: whatever an earlier attempt left (a run
    the reaper queued again) is deleted, and the attempt counted."""
    s.execute(delete(RunResult).where(RunResult.run_id == run.id))
    run.attribution, run.mechanism, run.progress, run.error = None, None, 0.0, None
    run.attempts = (run.attempts or 0) + 1
    run.timings = {"queue_wait_ms": round(ms_since(run.created_at, as_utc(run.started_at) or now()), 1)}


def sweep_of(run_id: int) -> int | None:
    """The sweep a run belongs to (None: none, or the run is gone)."""
    with session() as s:
        return s.scalar(select(Run.sweep_id).where(Run.id == run_id))


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
        self._beat = jobs.Heartbeat(Run, run_id, hostname, deadline_s=deadline_s(RUNS))

    def __enter__(self) -> RunReporter:
        self._beat.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._beat.__exit__(*exc)

    def progress(self, stage: str, fraction: float) -> None:
        """The engine's progress callback: write (throttled), and stop if the run was cancelled or
        ran past its deadline (the solo pool does not enforce Celery's time limits itself)."""
        if self._beat.check_deadline():
            raise PastDeadline(deadline_message(RUNS, self.stage))
        if self._beat.stop.is_set():
            raise Stop
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
            mechanism: MechanismRecord | None = None, store_reuse: StoreReuse | None = None) -> bool:
    """Results (and the notes map, the dtype and device it computed in) and `succeeded` in one
    transaction, only while the run is still running under this worker (`worker.jobs.finish`: kept
    trying through a storage fault); False, nothing written, when it was cancelled or reaped."""
    columns = [attr.key for attr in sa_inspect(RunResult).column_attrs if attr.key != "id"]
    values = [{key: getattr(row, key) for key in columns} for row in rows]

    def results(s: Session) -> None:  # fresh rows each try: a failed try's rows went with its rollback
        s.execute(delete(RunResult).where(RunResult.run_id == run_id))
        s.add_all(RunResult(**value) for value in values)
        run = s.get(Run, run_id)
        run.timings = {**(run.timings or {}), **timings}

    return jobs.finish(Run, run_id, hostname, RunStatus.SUCCEEDED, also=results, stage="done", progress=1.0,
                       error=None, attribution=attribution, mechanism=mechanism, dtype=dtype or None,
                       device=device or None, store_reuse=store_reuse)


def stopped(run_id: int) -> None:
    """After a cancellation: drop partial results, stamp the end; the status stays as the web set
    it. A run that was taken from us otherwise (reaped, restarted elsewhere) is left alone."""
    with session() as s:
        run = s.get(Run, run_id)
        if run is not None and run.status == RunStatus.CANCELLED:
            s.execute(delete(RunResult).where(RunResult.run_id == run_id))
            run.stage, run.finished_at = "cancelled", run.finished_at or now()
        s.commit()
