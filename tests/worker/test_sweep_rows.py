"""A sweep's side of the worker, on a real (SQLite) database and the tiny llama: the document's notes
are prefilled once per sweep and worker (a second edit gets the same notes, document_prefills
stays 1); a sweep's edit lost with its worker is taken again once, and lost a second time it is
failed with the reason while the sweep finishes with what it has. Without the broker delivering
the lost message again (the embedded broker never does): the watchdog's lost edit is queued again
once under a fresh token (one new message on the model's queue; the old token is refused), its
sweep reads running meanwhile, and lost a second time it is failed for good and the sweep ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from data.contracts import RunSnapshot, SnapshotField, SnapshotQuestion, SweepEdit
from data.models import Notebook, Run, RunStatus, Sweep
from tests.api.conftest import _broker_messages
from tests.conftest import migrate

DOC = "Account record.\nstatus: active\nOnly active accounts may log in.\n"


def _sweep(session, n: int) -> tuple[int, list[int]]:
    nb = Notebook(title="t", model="tiny-llama", document=DOC)
    session.add(nb)
    session.flush()
    q = SnapshotQuestion(text="Can they log in?", choices=["yes", "no"], cot=False)
    sweep = Sweep(notebook_id=nb.id, model="tiny-llama", question=q, strategies=["recompute", "stale"],
                  threshold=0.95, mode="values", status=RunStatus.RUNNING, edits_total=n, edits_done=0,
                  edits_skipped=0, document_prefills=0)
    session.add(sweep)
    session.flush()
    start = DOC.index("active")
    runs = []
    for i in range(n):
        snapshot = RunSnapshot(model="tiny-llama", document=DOC, errata=[], placements=[], question=q,
                               strategies=["recompute", "stale"], sweep_id=sweep.id,
                               fields=[SnapshotField(start=start, end=start + 6, old="active",
                                                     new=f"state{i}", label="status")])
        runs.append(Run(notebook_id=nb.id, snapshot=snapshot, strategies=["recompute", "stale"],
                        status=RunStatus.QUEUED, sweep_id=sweep.id,
                        sweep_edit=SweepEdit(position=i, group="status", values={"status": f"state{i}"})))
    session.add_all(runs)
    session.commit()
    return sweep.id, [r.id for r in runs]


def test_a_lost_edit_is_retried_once_then_failed_and_the_sweep_finishes(isolated) -> None:
    isolated()
    from data.db import get_sessionmaker
    from worker import run_rows

    migrate()
    maker = get_sessionmaker()
    with maker() as s:
        sweep_id, (first, second) = _sweep(s, 2)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with maker() as s:  # the first edit ran once, then its worker went silent
        run = s.get(Run, first)
        run.status, run.worker, run.task_id, run.attempts = RunStatus.RUNNING, "gone@host", "t1", 1
        run.started_at = run.heartbeat_at = long_ago
        s.commit()
    assert run_rows.claim(first, "new@host", "t1") is not None  # taken again: its second attempt
    with maker() as s:
        run = s.get(Run, first)
        assert (run.status, run.worker, run.attempts) == (RunStatus.RUNNING, "new@host", 2)
        run.started_at = run.heartbeat_at = long_ago  # and lost again
        s.commit()
    assert run_rows.claim(first, "third@host", "t1") is None
    with maker() as s:
        run = s.get(Run, first)
        assert run.status == RunStatus.FAILED and run.error.startswith("lost twice (retried once")
        assert s.get(Sweep, sweep_id).status == RunStatus.RUNNING  # the second edit is still to run
        s.get(Run, second).status = RunStatus.SUCCEEDED
        s.commit()
    from worker.sweep_rows import refresh

    refresh(sweep_id)
    with maker() as s:
        sweep = s.get(Sweep, sweep_id)
        assert (sweep.status, sweep.edits_done) == (RunStatus.SUCCEEDED, 2)
        assert sweep.error == ("1 of 2 edits; 1 failed: lost twice (retried once after its worker was "
                               "lost): worker lost while running. The sweep reports the 1 that finished")
        assert sweep.finished_at is not None


def test_the_document_is_prefilled_once_per_sweep_and_worker(isolated, data_dir) -> None:
    isolated(KVNOTES_DATA=str(data_dir))
    from data.db import get_sessionmaker
    from worker.engine import load
    from worker.sweep_rows import sweep_notes

    migrate()
    maker = get_sessionmaker()
    with maker() as s:
        sweep_id, runs = _sweep(s, 3)
        snapshots = [s.get(Run, r).snapshot for r in runs]
    eng = load("tiny-llama", device="cpu", data_dir=data_dir)
    notes = [sweep_notes(eng, snapshot) for snapshot in snapshots]
    assert notes[0] is notes[1] is notes[2]
    with maker() as s:
        assert s.get(Sweep, sweep_id).document_prefills == 1


def test_the_watchdogs_lost_edit_is_queued_again_once_then_failed_for_good(isolated, tmp_path) -> None:
    isolated()
    from data.db import get_sessionmaker
    from data.sweep_edits import retry_lost_edits
    from data.watchdog import reap
    from worker import run_rows

    migrate()
    maker = get_sessionmaker()
    with maker() as s:
        sweep_id, (lost, other) = _sweep(s, 2)
    long_ago = datetime.now(UTC) - timedelta(hours=1)

    def lose(run_id: int) -> str:
        """The edit ran under a worker that then went silent; its token."""
        with maker() as s:
            run = s.get(Run, run_id)
            run.status, run.worker, run.attempts = RunStatus.RUNNING, "gone@host", run.attempts + 1
            run.started_at = run.heartbeat_at = long_ago
            s.commit()
            return run.task_id

    first_token = lose(lost)
    with maker() as s:
        reap(s)  # the one reaper (the workers' beat, `kvnotes serve`): the rules, then the retry
    with maker() as s:
        run = s.get(Run, lost)
        assert (run.status, run.stage, run.error, run.attempts) == \
            (RunStatus.QUEUED, "queued again: its worker was lost", None, 1)
        assert run.task_id != first_token and s.get(Sweep, sweep_id).status == RunStatus.RUNNING
        second_token = run.task_id
    messages = [m for _, m in _broker_messages(tmp_path) if m["run_id"] == lost]
    assert [m["id"] for m in messages] == [second_token]  # one message, under the fresh token
    assert run_rows.claim(lost, "w2@host", first_token) is None  # the old message: dropped
    assert run_rows.claim(lost, "w2@host", second_token) is not None
    with maker() as s:
        assert (s.get(Run, lost).status, s.get(Run, lost).attempts) == (RunStatus.RUNNING, 2)
        s.get(Run, other).status = RunStatus.SUCCEEDED
        s.commit()
    with maker() as s:  # lost again: no retry left
        run = s.get(Run, lost)
        run.started_at = run.heartbeat_at = long_ago
        s.commit()
        reap(s)
    with maker() as s:
        run, sweep = s.get(Run, lost), s.get(Sweep, sweep_id)
        assert (run.status, run.attempts) == (RunStatus.FAILED, 2)
        assert run.error == "lost twice (retried once after its worker was lost): worker lost while running"
        assert (sweep.status, sweep.edits_done) == (RunStatus.SUCCEEDED, 2)
        assert sweep.error.startswith("1 of 2 edits; 1 failed: lost twice")
    assert len([m for _, m in _broker_messages(tmp_path) if m["run_id"] == lost]) == 1  # none sent again
    with maker() as s:  # nothing left to do: a second call changes nothing
        assert (retry_lost_edits(s).requeued, retry_lost_edits(s).failed) == ([], [])


def test_a_lost_message_counts_as_an_attempt_and_a_cancelled_sweep_is_left_alone(isolated) -> None:
    isolated()
    from data.db import get_sessionmaker
    from data.sweep_edits import retry_lost_edits
    from data.watchdog import MESSAGE_LOST, WORKER_LOST

    migrate()
    maker = get_sessionmaker()
    with maker() as s:
        sweep_id, (message_lost, worker_lost) = _sweep(s, 2)
        s.get(Run, message_lost).status, s.get(Run, message_lost).error = RunStatus.FAILED, MESSAGE_LOST
        s.commit()
        assert retry_lost_edits(s).requeued == [message_lost]
        assert s.get(Run, message_lost).attempts == 1  # the lost delivery counted: one retry only
        run = s.get(Run, message_lost)
        run.status, run.error = RunStatus.FAILED, MESSAGE_LOST
        s.commit()
        assert retry_lost_edits(s).failed == [message_lost]
        s.get(Sweep, sweep_id).status = RunStatus.CANCELLED
        run = s.get(Run, worker_lost)
        run.status, run.error, run.attempts = RunStatus.FAILED, WORKER_LOST, 1
        s.commit()
        assert (retry_lost_edits(s).requeued, s.get(Run, worker_lost).status) == ([], RunStatus.FAILED)
