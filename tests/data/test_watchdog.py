"""The watchdog on a real, migrated SQLite database: which `running` runs count as lost, and which
ran past their deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from data.db import make_engine
from data.models import Run
from data.watchdog import WORKER_LOST, reap_stale_runs
from tests.conftest import migrate
from tests.data.conftest import SNAPSHOT

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
def session(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/kvnotes.db"
    migrate(url)
    with Session(make_engine(url)) as s:
        yield s


def _run(
    session: Session, status: str, worker: str, heartbeat_s_ago: float | None, started_s_ago: float = 600
) -> int:
    run = Run(
        snapshot=SNAPSHOT,
        strategies=["recompute"],
        status=status,
        worker=worker,
        started_at=NOW - timedelta(seconds=started_s_ago),
        heartbeat_at=None if heartbeat_s_ago is None else NOW - timedelta(seconds=heartbeat_s_ago),
    )
    session.add(run)
    session.commit()
    return run.id


def test_only_running_runs_silent_longer_than_max_age_are_failed(session: Session) -> None:
    stale = _run(session, "running", "w1@h", heartbeat_s_ago=121)
    fresh = _run(session, "running", "w1@h", heartbeat_s_ago=30)
    never_beat_old = _run(session, "running", "w2@h", heartbeat_s_ago=None, started_s_ago=500)
    never_beat_new = _run(session, "running", "w2@h", heartbeat_s_ago=None, started_s_ago=5)
    done = _run(session, "succeeded", "w1@h", heartbeat_s_ago=999)
    queued = _run(session, "queued", "", heartbeat_s_ago=None)

    reaped = reap_stale_runs(session, NOW, max_age=120)
    session.commit()

    assert sorted(reaped) == sorted([stale, never_beat_old])
    session.expire_all()
    for run_id in (stale, never_beat_old):
        run = session.get(Run, run_id)
        assert (run.status, run.error) == ("failed", WORKER_LOST) and run.finished_at is not None
    for run_id, status in (
        (fresh, "running"),
        (never_beat_new, "running"),
        (done, "succeeded"),
        (queued, "queued"),
    ):
        assert session.get(Run, run_id).status == status


def test_a_starting_worker_fails_every_run_left_under_its_name(session: Session) -> None:
    mine = _run(session, "running", "kvnotes-tiny-llama@h", heartbeat_s_ago=1)
    other = _run(session, "running", "kvnotes-other@h", heartbeat_s_ago=1)
    assert reap_stale_runs(session, NOW, max_age=120, worker="kvnotes-tiny-llama@h") == [mine]
    session.commit()
    assert session.get(Run, other).status == "running"


def test_a_job_stuck_past_its_deadline_is_failed_saying_so_and_its_worker_named(isolated) -> None:
    """`KVNOTES_JOB_DEADLINE_S` per kind: a run past its deadline + the grace is failed with a
    message naming the deadline and that its worker is replaced (`stuck_jobs`, which its
    supervisor reads); one within it runs on; a bad setting is refused naming the part."""
    from pydantic import ValidationError

    from data.db import get_sessionmaker
    from data.jobs import RUNS, TRAJECTORIES, deadline_s
    from data.settings import Settings
    from data.watchdog import DEADLINE_GRACE_S, reap_overdue, stuck_jobs

    isolated(KVNOTES_JOB_DEADLINE_S="600,run=30")
    migrate()
    assert (deadline_s(RUNS), deadline_s(TRAJECTORIES)) == (30.0, 600.0)
    maker, now = get_sessionmaker(), datetime.now(UTC)
    with maker() as s:
        ids = []
        for started_s_ago in (30 + DEADLINE_GRACE_S + 5, 30 + DEADLINE_GRACE_S - 5):
            run = Run(snapshot=SNAPSHOT, strategies=["recompute"], status="running", worker="w@h",
                      started_at=now - timedelta(seconds=started_s_ago), heartbeat_at=now, timings={},
                      stage="strategy: stale")
            s.add(run)
            s.commit()
            ids.append(run.id)
        assert reap_overdue(s, RUNS, now) == [ids[0]]
        s.commit()
        stuck = s.get(Run, ids[0])
        assert stuck.status == "failed" and stuck.error.startswith(
            "the run ran past its deadline of 30 s (KVNOTES_JOB_DEADLINE_S) during strategy: stale: it did "
            "not come back from that step, so its worker is replaced")
        assert s.get(Run, ids[1]).status == "running"
        assert stuck_jobs(s, "w@h", now - timedelta(seconds=1)) == [("run", ids[0])]
        assert stuck_jobs(s, "other@h", now - timedelta(seconds=1)) == []
    for bad, says in (("sweep=3", "'sweep=3' names no kind"), ("run=0", "'run=0' is not a number"),
                      ("soon", "'soon' is not a number")):
        with pytest.raises(ValidationError, match=says):
            Settings(KVNOTES_JOB_DEADLINE_S=bad)
