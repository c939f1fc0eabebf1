"""Every job state change is conditional (issue 41): the races a busy server finds, each run many
times over on SQLite and on PostgreSQL, with the real service and worker functions in real threads
against a real database (no Celery process: the race is between two writers, and these are the
writers a worker and a web request run).

- **Cancel against success** (200 tries per database): a run cancelled at the moment its worker
  writes its success ends `succeeded` with its results or `cancelled` without them, never
  `cancelled` with results, and the loser is told it lost.
- **Reaper against a fresh heartbeat** (200 tries per database): the reaper read a job as silent,
  then its heartbeat landed: the reaper's write changes nothing. And with its worker's registry
  beat 40 s late, a job whose own heartbeat is fresh is never reaped (a worker writing heartbeats
  in a thread while the reaper runs over and over).
- **A sweep's cancel against its last edit** (100 tries per database): the sweep ends cancelled or
  exhausted, never a cancelled sweep rewritten as exhausted, never an edit cancelled with results
  (the old code gave both).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from data.models import Run, RunResult, RunStatus
from tests.conftest import migrate
from tests.data.conftest import SNAPSHOT

TRIES = 200
WORKER = "kvnotes-tiny-llama-race@host"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, isolated):
    """A fresh, migrated database of each kind, this process pointed at it."""
    overrides = {"KVNOTES_MODELS": SNAPSHOT.model, "KVNOTES_DEFAULT_MODEL": SNAPSHOT.model}
    if request.param == "postgresql":
        overrides["DATABASE_URL"] = request.getfixturevalue("postgres_url")
    isolated(**overrides)
    migrate()
    from data.db import get_sessionmaker

    return get_sessionmaker()


def _running_run(maker, heartbeat_s_ago: float = 0.0) -> int:
    now = datetime.now(UTC)
    with maker() as s:
        run = Run(snapshot=SNAPSHOT, strategies=["recompute", "stale"], status=RunStatus.RUNNING,
                  stage="engine", worker=WORKER, task_id=None, started_at=now - timedelta(seconds=600),
                  heartbeat_at=now - timedelta(seconds=heartbeat_s_ago), timings={}, attempts=1)
        s.add(run)
        s.commit()
        return run.id


def _results(run_id: int) -> list[RunResult]:
    return [RunResult(run_id=run_id, strategy=name, decision="yes", choice_probs={"yes": 0.9},
                      kl_to_recompute=0.0 if name == "recompute" else 0.01)
            for name in ("recompute", "stale")]


def _together(*calls) -> list:
    """Run `calls` in threads released at the same moment; their results in order."""
    gate = threading.Barrier(len(calls))
    out: list = [None] * len(calls)

    def one(i: int, call) -> None:
        gate.wait()
        out[i] = call()

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_cancel_racing_success_never_ends_cancelled_with_results(database) -> None:
    from app.services.jobs import cancel
    from worker import run_rows

    outcomes = {"succeeded": 0, "cancelled": 0}
    for _ in range(TRIES):
        run_id = _running_run(database)

        def cancelling(run_id: int = run_id) -> bool:
            with database() as s:  # the web's cancel, on its own request session
                return cancel(s, s.get(Run, run_id))

        def succeeding(run_id: int = run_id) -> bool:  # the worker held just before its final write
            return run_rows.succeed(run_id, WORKER, _results(run_id), {"engine_ms": 1.0})

        cancelled, succeeded = _together(cancelling, succeeding)
        with database() as s:
            run = s.get(Run, run_id)
            results = s.scalar(select(func.count(RunResult.id)).where(RunResult.run_id == run_id))
        assert cancelled != succeeded, (cancelled, succeeded)  # exactly one writer won, the other knows
        if run.status == RunStatus.SUCCEEDED:
            assert succeeded and results == 2 and run.progress == 1.0
        else:
            assert run.status == RunStatus.CANCELLED and cancelled and results == 0, (run.status, results)
        outcomes[run.status] += 1
    assert sum(outcomes.values()) == TRIES
    print(f"\ncancel against success, {TRIES} tries: {outcomes}")


def test_a_heartbeat_that_lands_after_the_reaper_read_wins(database) -> None:
    from data.jobs import RUNS
    from data.watchdog import Reaped, lose, reap_stale
    from worker import jobs

    max_age = 120.0
    kept = 0
    for _ in range(TRIES):
        run_id = _running_run(database, heartbeat_s_ago=max_age + 30)
        now = datetime.now(UTC)
        with database() as s:
            rule = (Run.heartbeat_at < now - timedelta(seconds=max_age),)
            row = s.scalars(select(Run).where(Run.id == run_id, *rule)).one()  # read as silent ...
            assert jobs.write(Run, run_id, WORKER, stage="beat")  # ... then its heartbeat lands
            assert not lose(s, RUNS, row, "worker lost", now, Reaped(), where=rule)
            s.commit()
            assert reap_stale(s, RUNS, now, max_age) == []
            s.commit()
        with database() as s:
            kept += s.get(Run, run_id).status == RunStatus.RUNNING
    assert kept == TRIES


def test_a_late_registry_beat_never_gets_a_job_with_a_fresh_heartbeat_reaped(database) -> None:
    """The worker's registry beat 40 s late (past the 30 s staleness), its job's own heartbeat
    written every 50 ms from a thread; the reaper runs 200 times meanwhile: the job keeps running."""
    from data import workers
    from data.queue import queue_for
    from data.watchdog import reap
    from worker import jobs

    with database() as s:
        workers.register(s, WORKER, [queue_for(SNAPSHOT.model)], "host", 4242)
        s.get(workers.Worker, WORKER).beat_at = datetime.now(UTC) - timedelta(seconds=40)
        s.commit()
        assert WORKER in workers.dead_worker_names(s)  # the registry thinks it dead
    run_id = _running_run(database, heartbeat_s_ago=0)
    stop, beats = threading.Event(), [0]

    def heartbeat() -> None:
        while not stop.wait(0.05):
            beats[0] += jobs.write(Run, run_id, WORKER)

    beating = threading.Thread(target=heartbeat)
    beating.start()
    try:
        for _ in range(TRIES):
            with database() as s:
                reap(s)
    finally:
        stop.set()
        beating.join()
    with database() as s:
        run = s.get(Run, run_id)
        assert (run.status, run.error) == (RunStatus.RUNNING, None)
    assert beats[0] > 0


def test_a_sweep_cancelled_as_its_last_edit_ends_is_never_rewritten(database) -> None:
    """A sweep's cancel against its last edit's success and the refresh that follows (100 tries):
    the sweep ends cancelled or exhausted, each consistent (a cancelled sweep is never rewritten as
    exhausted), and its edit is never cancelled with results."""
    from app.services.sweeps import cancel_sweep
    from data.contracts import SweepEdit
    from data.models import Notebook, Sweep
    from data.sweep_edits import STOPPED_CANCELLED, STOPPED_EXHAUSTED, refresh_sweep
    from worker import run_rows

    ends = {"cancelled": 0, "succeeded": 0}
    for _ in range(TRIES // 2):
        with database() as s:
            nb = Notebook(title="t", model=SNAPSHOT.model, document=SNAPSHOT.document)
            s.add(nb)
            s.flush()
            sweep = Sweep(notebook_id=nb.id, model=SNAPSHOT.model, question=SNAPSHOT.question,
                          strategies=["recompute"], status="running", edits_total=1, edits_done=0)
            s.add(sweep)
            s.flush()
            snapshot = SNAPSHOT.model_copy(update={"sweep_id": sweep.id})
            run = Run(notebook_id=nb.id, snapshot=snapshot, strategies=["recompute"], status="running",
                      worker=WORKER, sweep_id=sweep.id, started_at=datetime.now(UTC), timings={},
                      sweep_edit=SweepEdit(position=0, group="status", values={"status": "x"}))
            s.add(run)
            s.commit()
            sweep_id, run_id = sweep.id, run.id

        def cancelling(sweep_id: int = sweep_id) -> int:
            with database() as s:
                return cancel_sweep(s, s.get(Sweep, sweep_id))

        def ending(run_id: int = run_id, sweep_id: int = sweep_id) -> bool:
            done = run_rows.succeed(run_id, WORKER, _results(run_id)[:1], {"engine_ms": 1.0})
            with database() as s:
                refresh_sweep(s, sweep_id)
            return done

        _together(cancelling, ending)
        with database() as s:
            sweep, run = s.get(Sweep, sweep_id), s.get(Run, run_id)
            results = s.scalar(select(func.count(RunResult.id)).where(RunResult.run_id == run_id))
        assert (sweep.status, sweep.stopped, run.status, results) in (
            ("cancelled", STOPPED_CANCELLED, "cancelled", 0),  # the cancel won: the edit with it
            ("cancelled", STOPPED_CANCELLED, "succeeded", 1),  # the edit ended first, the sweep was cancelled
            ("succeeded", STOPPED_EXHAUSTED, "succeeded", 1),  # the edit and the sweep's end first
        ), (sweep.status, sweep.stopped, run.status, results)
        ends[sweep.status] += 1
    print(f"\nsweep cancel against its last edit, {TRIES // 2} tries: {ends}")
