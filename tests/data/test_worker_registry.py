"""The live-worker registry and the watchdog rules built on it, on a real migrated SQLite database:
a job is lost only when its own heartbeat is silent (a worker missing from the registry is not
enough), a queued run whose message is gone (a live worker of its model idle for longer than the
grace) is sent again once, a queued run with no worker at all waits, a duplicate worker name is
noticed, and health names the models without a live worker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from data import workers
from data.models import Run
from data.queue import queue_for
from data.watchdog import (
    MESSAGE_LOST,
    QUEUED_GRACE_S,
    RESENT_STAGE,
    WORKER_LOST,
    reap_lost_messages,
    reap_stale_runs,
)
from tests.conftest import migrate
from tests.data.conftest import SNAPSHOT

MODEL = SNAPSHOT.model


@pytest.fixture
def session(isolated, tmp_path: Path):
    isolated(KVNOTES_MODELS=MODEL, KVNOTES_DEFAULT_MODEL=MODEL)
    from data.db import get_sessionmaker

    migrate()
    with get_sessionmaker()() as s:
        yield s


def _worker(session: Session, name: str, beat_s_ago: float, idle_s: float | None, now: datetime) -> None:
    workers.register(session, name, [queue_for(MODEL)], "host", 1000 + len(name))
    row = session.get(workers.Worker, name)
    row.beat_at = now - timedelta(seconds=beat_s_ago)
    row.idle_since = None if idle_s is None else now - timedelta(seconds=idle_s)
    session.commit()


def _run(session: Session, status: str, worker: str | None, age_s: float, now: datetime) -> int:
    run = Run(snapshot=SNAPSHOT, strategies=["recompute"], status=status, worker=worker,
              created_at=now - timedelta(seconds=age_s), started_at=now - timedelta(seconds=age_s),
              # a queued run has no heartbeat until a worker takes it (or the sweep queues it again)
              heartbeat_at=now - timedelta(seconds=1) if status == "running" else None, timings={})
    session.add(run)
    session.commit()
    return run.id


def test_a_job_is_lost_by_its_own_heartbeat_not_by_the_registry(session: Session) -> None:
    now = datetime.now(UTC)
    _worker(session, "alive@h", beat_s_ago=2, idle_s=None, now=now)
    _worker(session, "silent@h", beat_s_ago=60, idle_s=None, now=now)  # its registry beat is late
    alive = _run(session, "running", "alive@h", 30, now)
    beating = _run(session, "running", "silent@h", 30, now)  # ... but its job's own heartbeat is fresh
    workers.mark_stopped(session, "alive@h")
    session.commit()
    assert reap_stale_runs(session, now, max_age=120) == []
    session.commit()
    assert {session.get(Run, i).status for i in (alive, beating)} == {"running"}
    later = now + timedelta(seconds=121)  # no heartbeat for 121 s: lost
    assert sorted(reap_stale_runs(session, later, max_age=120)) == sorted([alive, beating])
    session.commit()
    assert (session.get(Run, beating).status, session.get(Run, beating).error) == ("failed", WORKER_LOST)


def test_a_queued_run_whose_message_is_gone_fails_but_one_waiting_for_a_worker_does_not(
        session: Session) -> None:
    now = datetime.now(UTC)
    old = _run(session, "queued", None, QUEUED_GRACE_S + 60, now)
    fresh = _run(session, "queued", None, 5, now)
    assert reap_lost_messages(session, now) == []  # no worker at all: the message still waits in the queue
    _worker(session, "busy@h", beat_s_ago=1, idle_s=None, now=now)
    assert reap_lost_messages(session, now) == []  # a busy worker will take it next
    _worker(session, "idle@h", beat_s_ago=1, idle_s=QUEUED_GRACE_S + 30, now=now)
    assert reap_lost_messages(session, now) == [old]  # queued again once (the one retry path) ...
    session.commit()
    assert (session.get(Run, old).status, session.get(Run, old).stage) == ("queued", RESENT_STAGE)
    assert session.get(Run, fresh).status == "queued"
    later = now + timedelta(seconds=QUEUED_GRACE_S + 1)
    _worker(session, "idle@h", beat_s_ago=0, idle_s=QUEUED_GRACE_S + 5, now=later)
    assert old in reap_lost_messages(session, later)  # ... then failed: lost twice
    session.commit()
    assert session.get(Run, old).status == "failed"
    assert MESSAGE_LOST.split(" with")[0] in session.get(Run, old).error


def test_a_duplicate_name_is_noticed_and_health_names_models_without_a_worker(session: Session) -> None:
    from data.health import health

    now = datetime.now(UTC)
    assert health(session)["workers"] == f"no live worker for {MODEL}"
    _worker(session, "kvnotes-x@h", beat_s_ago=1, idle_s=5, now=now)
    report = health(session)
    assert report["workers"] == "ok" and report["database"] == "ok"
    assert workers.register(session, "kvnotes-x@h", [queue_for(MODEL)], "host", 4242) is False


def test_health_names_a_worker_still_converting_its_model_and_is_ok_only_once_it_is_ready(
        session: Session) -> None:
    from data.health import health

    workers.register(session, "kvnotes-new@h", [queue_for(MODEL)], "host", 777, starting="starting")
    session.commit()
    assert health(session)["workers"] == "starting: starting"
    workers.set_starting(session, "kvnotes-new@h", f"converting {MODEL}")
    session.commit()
    report = health(session)
    assert report["status"] == "degraded" and report["workers"] == f"starting: converting {MODEL}", report
    assert workers.models_without_worker(session, [MODEL]) == []  # served soon: runs wait, not refused
    workers.set_running(session, "kvnotes-new@h", None)  # ready: the model is loaded
    session.commit()
    assert health(session) == {"status": "ok", "database": "ok", "broker": "ok", "workers": "ok"}
    assert session.get(workers.Worker, "kvnotes-new@h").starting is None


def test_a_ready_worker_beside_a_starting_one_keeps_health_ok(session: Session) -> None:
    from data.health import health

    workers.register(session, "kvnotes-ready@h", [queue_for(MODEL)], "host", 778)
    workers.register(session, "kvnotes-second@h", [queue_for(MODEL)], "host", 779,
                     starting=f"loading {MODEL}")
    session.commit()
    assert health(session)["workers"] == "ok"


def test_a_beat_without_a_live_row_says_so(session: Session) -> None:
    assert workers.beat(session, "kvnotes-never@h") is False
    workers.register(session, "kvnotes-b@h", [queue_for(MODEL)], "host", 780)
    assert workers.beat(session, "kvnotes-b@h") is True
    workers.mark_stopped(session, "kvnotes-b@h")
    assert workers.beat(session, "kvnotes-b@h") is False


def test_the_reaper_sends_a_lost_message_again_once_then_fails_the_job(session: Session,
                                                                        tmp_path: Path) -> None:
    """A queued job (a run, a trajectory) whose message went with a worker never started: the one
    reaper sends it again once under a fresh token (one new message on its model's queue), and
    fails it with the reason when that message is lost too."""
    from data.trajectories import Trajectory
    from data.watchdog import LOST_AGAIN, RESENT_STAGE, reap
    from tests.api.conftest import _broker_messages
    from vocabulary.trajectories import FieldSpec, TrajectorySpec, TurnSpec

    now = datetime.now(UTC)
    run_id = _run(session, "queued", None, QUEUED_GRACE_S + 60, now)
    spec = TrajectorySpec(model=MODEL, document="status: active", fields=(FieldSpec("status", 8, 14),),
                          turns=(TurnSpec(append=" more"),), question="Active?", choices=("yes", "no"),
                          strategies=("recompute",))
    trajectory = Trajectory(model=MODEL, spec=spec, status="queued", stage="queued", turns_total=1,
                            created_at=now - timedelta(seconds=QUEUED_GRACE_S + 60))
    session.add(trajectory)
    session.commit()
    tokens = {session.get(Run, run_id).task_id, trajectory.task_id}
    _worker(session, "idle@h", beat_s_ago=1, idle_s=QUEUED_GRACE_S + 30, now=now)
    reaped = reap(session, now)
    assert not reaped and [(k.name, i) for k, i, _ in reaped.resend] == [("run", run_id),
                                                                        ("trajectory", trajectory.id)]
    session.expire_all()
    run, trajectory = session.get(Run, run_id), session.get(Trajectory, trajectory.id)
    assert (run.status, run.stage, trajectory.status, trajectory.stage) == ("queued", RESENT_STAGE) * 2
    assert not {run.task_id, trajectory.task_id} & tokens  # fresh tokens: the lost messages are refused
    sent = {m["id"] for _, m in _broker_messages(tmp_path)}
    assert {run.task_id, trajectory.task_id} <= sent and len(sent) == 2
    later = now + timedelta(seconds=QUEUED_GRACE_S + 1)  # lost again
    _worker(session, "idle2@h", beat_s_ago=0, idle_s=QUEUED_GRACE_S + 5, now=later)
    reaped = reap(session, later)
    assert reaped.ids == {"run": [run_id], "trajectory": [trajectory.id]} and not reaped.resend
    session.expire_all()
    assert session.get(Run, run_id).error == session.get(Trajectory, trajectory.id).error == LOST_AGAIN
    assert len(_broker_messages(tmp_path)) == 2  # none sent a third time
