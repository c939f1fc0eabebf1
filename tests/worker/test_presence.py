"""A worker's presence while it starts and after the registry could not hear it, on a real migrated
SQLite database: it says what it does before it can take a run ("converting smollm2-135m" for a
bundled model not yet converted, "loading ..." otherwise), and a worker whose registration failed
(a read-only database) or whose row was marked stopped registers again at its next beat, as it is
then (starting, ready, or busy with a run); a hung reap pass never delays the beat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data import workers
from data.queue import queue_for
from tests.conftest import migrate

NAME = "kvnotes-presence@here"


@pytest.fixture
def db(isolated):
    isolated(KVNOTES_MODELS="tiny-llama", KVNOTES_DEFAULT_MODEL="tiny-llama")
    from data.db import get_sessionmaker

    migrate()
    return get_sessionmaker()


def test_a_bundled_model_not_yet_converted_is_converting_else_loading(db, tmp_path: Path) -> None:
    from worker.engine.models import CONVERTED_MARKER, converted_dir
    from worker.runtime import loading_stage

    assert loading_stage("smollm2-135m") == "converting smollm2-135m (first use)"  # a fresh data folder
    assert loading_stage("tiny-llama") == "loading tiny-llama"  # built from a config: nothing to convert
    folder = converted_dir("smollm2-135m", tmp_path)
    folder.mkdir(parents=True)
    (folder / CONVERTED_MARKER).write_text(json.dumps({"alias": "smollm2-135m"}))
    assert loading_stage("smollm2-135m") == "loading smollm2-135m"


@pytest.fixture
def presence_state():
    """The worker's presence state, restored after the test (it is the process's)."""
    from worker import presence

    saved = dict(presence._state)
    yield presence._state
    presence._state.clear()
    presence._state.update(saved)


def _row(db) -> workers.Worker | None:
    with db() as s:
        return s.get(workers.Worker, NAME)


def test_a_worker_the_registry_lost_registers_again_at_its_next_beat(db, presence_state) -> None:
    from data.health import health
    from worker import presence

    presence_state.update(name=NAME, queues=[queue_for("tiny-llama")], starting="loading tiny-llama",
                           task=None)
    with db() as s:  # its registration never reached the database (read-only then)
        presence._beat_or_register(s, NAME)
        s.commit()
    row = _row(db)
    assert row is not None and row.starting == "loading tiny-llama" and row.stopped_at is None
    with db() as s:
        assert health(s)["workers"] == "starting: loading tiny-llama"
    presence_state.update(starting=None, task=7)  # ready, and busy with run 7 when the row is lost
    with db() as s:
        workers.mark_stopped(s, NAME)  # e.g. its supervisor could not tell it from a dead one
        s.commit()
    with db() as s:
        presence._beat_or_register(s, NAME)
        s.commit()
    row = _row(db)
    assert row.stopped_at is None and row.starting is None and row.running_run_id == 7
    presence_state.update(task=None)
    with db() as s:
        workers.set_running(s, NAME, None)
        s.commit()
        assert health(s)["workers"] == "ok"
        assert workers.beat(s, NAME) is True


def test_a_slow_reap_pass_never_delays_the_registry_beat(db, presence_state, monkeypatch) -> None:
    """The reaper runs in a thread of its own (issue 41): a reap pass that hangs (a broker that does
    not answer, a busy database) leaves the registry beat and the liveness row on time, so the
    worker never looks dead to the others for it."""
    import threading
    import time

    from data.health import HealthProbe
    from data.models import as_utc
    from worker import presence

    hung, passes = threading.Event(), []
    monkeypatch.setattr(presence, "BEAT_S", 0.1)
    monkeypatch.setattr(presence, "WATCH_EVERY_S", 0.1)
    monkeypatch.setattr(presence, "_reap", lambda _session: (passes.append(1), hung.wait(30)))
    presence_state.update(name=None, task=None)
    assert presence.start(NAME, [queue_for("tiny-llama")])
    try:
        time.sleep(0.5)
        assert passes == [1]  # the reaper started its (hung) pass ...
        with db() as s:
            first = as_utc(s.get(workers.Worker, NAME).beat_at)
            live = as_utc(s.get(HealthProbe, 1).checked_at)
        time.sleep(1.5)
        with db() as s:  # ... and the beat went on meanwhile: ~15 beats in 1.5 s
            assert as_utc(s.get(workers.Worker, NAME).beat_at) > first
            assert as_utc(s.get(HealthProbe, 1).checked_at) > live
    finally:
        presence_state["stop"].set()
        hung.set()
