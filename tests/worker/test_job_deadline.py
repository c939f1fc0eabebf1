"""A hung trajectory is failed by its deadline and its worker replaced (issue 41): a real supervised
worker (`commands.supervisor.WorkerSupervisor`, as `kvnotes serve` runs it; tiny-llama on the
embedded broker) whose trajectory hangs inside a step — it never returns and never asks whether it
was cancelled, while its heartbeat thread goes on beating — past `KVNOTES_JOB_DEADLINE_S`
("trajectory=4": a deadline of 4 s for trajectories, runs keep theirs):
the trajectory ends `failed` with a message naming the deadline, the supervisor kills the stuck
worker and starts another, and the next run on that model starts and succeeds. The hang is this
test's `hang_site/sitecustomize.py`, on the worker's PYTHONPATH only."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import applied, kvnotes_env, migrate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HANG_SITE = Path(__file__).resolve().parent / "hang_site"
MODEL = "tiny-llama"
DOC = "Customer record. status: active. age: 34. Only active customers may log in."
DEADLINE_S = 4


def _poll(read, until, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if until(value):
            return value
        assert time.monotonic() < deadline, f"timed out; last: {value}"
        time.sleep(0.5)


def test_a_hung_trajectory_is_failed_by_its_deadline_and_the_next_run_starts(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    env = kvnotes_env(tmp_path, KVNOTES_MODELS=MODEL, KVNOTES_DEFAULT_MODEL=MODEL, KVNOTES_DEVICE="cpu",
                      KVNOTES_JOB_DEADLINE_S=f"trajectory={DEADLINE_S}")  # a run keeps the default
    path = os.pathsep.join([str(HANG_SITE), str(REPO), os.environ.get("PYTHONPATH", "")])
    worker_env = {**os.environ, **env, "PYTHONPATH": path}
    with applied(env):
        from app.main import create_app
        from commands.supervisor import WorkerSupervisor

        migrate()
        client = TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        nb = client.post("/api/notebooks", json={"title": "t", "model": MODEL, "text": DOC}).json()["id"]
        start = DOC.index("active")
        assert client.post(f"/api/notebooks/{nb}/fields", json={
            "start": start, "end": start + 6, "new_value": "banned", "label": "status"}).status_code == 201
        hung = client.post(f"/api/notebooks/{nb}/trajectories", json={
            "question": "Can this customer log in?", "choices": ["yes", "no"], "strategies": ["erratum"],
            "turns": [{"append": " HANG-IN-THIS-STEP"}]})
        assert hung.status_code == 201, hung.text
        trajectory = f"/api/trajectories/{hung.json()['id']}"
        supervisor = WorkerSupervisor([MODEL], env=worker_env)
        supervisor.start()
        try:
            _poll(lambda: client.get(trajectory).json()["status"], lambda s: s == "running", timeout=180)
            failed = _poll(lambda: client.get(trajectory).json(), lambda t: t["status"] != "running",
                           timeout=120)
            assert failed["status"] == "failed", failed
            assert f"ran past its deadline of {DEADLINE_S} s (KVNOTES_JOB_DEADLINE_S)" in failed["error"]
            _poll(lambda: supervisor.starts, lambda n: n >= 2, timeout=60)  # the stuck worker replaced
            run = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"})
            assert run.status_code == 201, run.text
            done = _poll(lambda: client.get(f"/api/runs/{run.json()['id']}").json(),
                         lambda r: r["status"] not in ("queued", "running"), timeout=240)
            assert done["status"] == "succeeded", done
            assert supervisor.starts == 2
        finally:
            supervisor.stop()
