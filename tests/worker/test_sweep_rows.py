"""A sweep's side of the worker, on a real (SQLite) database and the tiny llama: the document's notes
are prefilled once per sweep and worker (a second edit gets the same notes, document_prefills
stays 1). A lost edit is queued again by one path only, the reaper's: a message of its old token
delivered again by the broker never restarts it; the reaper queues it again once under a fresh
token (one new message on the model's queue; the old token is refused), its sweep reads running
meanwhile, and lost a second time it is failed for good and the sweep ends with what it has."""

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


def test_a_message_delivered_again_never_restarts_a_lost_edit_only_the_reaper_does(isolated) -> None:
    isolated(KVNOTES_MODELS="tiny-llama")
    from data.db import get_sessionmaker
    from data.watchdog import reap
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
    assert run_rows.claim(first, "new@host", "t1") is None  # the broker's redelivery: not a retry path
    with maker() as s:
        assert (s.get(Run, first).status, s.get(Run, first).worker) == (RunStatus.RUNNING, "gone@host")
        reap(s)
    with maker() as s:
        run = s.get(Run, first)
        assert (run.status, run.attempts) == (RunStatus.QUEUED, 1) and run.task_id != "t1"
        token = run.task_id
    assert run_rows.claim(first, "new@host", "t1") is None
    assert run_rows.claim(first, "new@host", token) is not None  # taken again: its second attempt
    with maker() as s:
        run = s.get(Run, first)
        assert (run.status, run.worker, run.attempts) == (RunStatus.RUNNING, "new@host", 2)
        run.started_at = run.heartbeat_at = long_ago  # and lost again
        s.commit()
        reap(s)
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


def test_two_sweeps_of_one_document_on_one_worker_share_no_notes_and_no_drafts(isolated, data_dir) -> None:
    """What a worker keeps between a sweep's edits (the notes, the readout of the old notes, each
    strategy's answer that drafts the next edit's) is the sweep's own: two sweeps over the same
    document on one worker, as two notebooks (two users) would make them, get separate notes, and
    the second sweep's first edit starts from no draft of the first sweep's answers."""
    isolated(KVNOTES_DATA=str(data_dir))
    from data.db import get_sessionmaker
    from worker.engine import Field, Question, RunRequest, load
    from worker.sweep_rows import _NOTES, sweep_notes

    _NOTES.clear()  # kept by an earlier test of this process under the same sweep ids
    migrate()
    maker = get_sessionmaker()
    with maker() as s:
        first, first_runs = _sweep(s, 1)
        second, second_runs = _sweep(s, 1)
        a, b = (s.get(Run, runs[0]).snapshot for runs in (first_runs, second_runs))
    eng = load("tiny-llama", device="cpu", data_dir=data_dir)
    start = DOC.index("active")

    def edit(notes, value: str):
        request = RunRequest(DOC, Question("What is the status?", (), max_new_tokens=4),
                             fields=(Field(start, start + 6, value, "status"),),
                             strategies=("recompute", "prefix_reuse", "erratum"), timing=False)
        return eng.run(request, notes=notes)

    mine, theirs = sweep_notes(eng, a), sweep_notes(eng, b)
    assert mine is not theirs and mine.derived is not theirs.derived
    edit(mine, "banned")
    again = edit(mine, "banned")  # the same sweep: drafted from its edit before
    assert all("kept from a draft" in r.detail for r in again.strategies.values())
    other = edit(theirs, "banned")  # the other sweep: nothing of the first one's answers
    assert all("draft" not in r.detail for r in other.strategies.values())
    assert [r.decision for r in other.strategies.values()] == [r.decision for r in again.strategies.values()]
    with maker() as s:
        assert (s.get(Sweep, first).document_prefills, s.get(Sweep, second).document_prefills) == (1, 1)
    _NOTES.clear()  # nor leave them to a later test


def test_the_watchdogs_lost_edit_is_queued_again_once_then_failed_for_good(isolated, tmp_path) -> None:
    isolated(KVNOTES_MODELS="tiny-llama")
    from data.db import get_sessionmaker
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
        assert not reap(s) and not reap(s).resend


def test_a_lost_message_counts_as_an_attempt(isolated) -> None:
    isolated(KVNOTES_MODELS="tiny-llama")
    from data import workers
    from data.db import get_sessionmaker
    from data.queue import queue_for
    from data.watchdog import MESSAGE_LOST, QUEUED_GRACE_S, reap_lost_messages

    migrate()
    maker = get_sessionmaker()
    now = datetime.now(UTC)
    with maker() as s:
        sweep_id, (message_lost, _other) = _sweep(s, 2)
        s.get(Run, message_lost).created_at = now - timedelta(seconds=QUEUED_GRACE_S + 60)
        s.get(Run, _other).created_at = now
        workers.register(s, "idle@h", [queue_for("tiny-llama")], "elsewhere", 1)
        s.get(workers.Worker, "idle@h").idle_since = now - timedelta(seconds=QUEUED_GRACE_S + 30)
        s.commit()
        assert reap_lost_messages(s, now) == [message_lost]
        s.commit()
        run = s.get(Run, message_lost)
        assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)  # the lost delivery counted
        later = now + timedelta(seconds=QUEUED_GRACE_S + 1)
        s.get(workers.Worker, "idle@h").beat_at = later
        s.commit()
        assert message_lost in reap_lost_messages(s, later)  # lost again: one retry only
        s.commit()
        run = s.get(Run, message_lost)
        assert run.status == RunStatus.FAILED and run.error == "lost twice (retried once after its worker " \
            "was lost): " + MESSAGE_LOST.removesuffix("; re-run it")
