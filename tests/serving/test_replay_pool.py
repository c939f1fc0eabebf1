"""Replays run off the model's worker (issue 32): on their own queue, in the replays' worker's
threads. With sign-in required and two users, four of Alice's replays held by an upstream that
answers `/v1/models` and `/tokenize` and then hangs leave the model's worker free: Bob's run
succeeds while all four still run. Runs and replays count together against a user's cap."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServedApp, kvnotes_cli
from tests.serving.conftest import make_notebook

pytestmark = pytest.mark.slow
SECRET = "s" * 16 + "-not-a-real-secret-but-long-enough-for-tests"
RECORD = "Account record. status: active. Only active accounts may log in."


def _signed_in(app: ServedApp, name: str) -> httpx.Client:
    added = kvnotes_cli("users", "add", name, "--password-stdin", env=app.env, stdin="a long password\n")
    assert added.returncode == 0, added.stderr
    token = kvnotes_cli("tokens", "create", name, env=app.env).stdout.strip()
    return httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _ready(app: ServedApp) -> set[str]:
    """The queues served by live workers that finished starting (the model loaded)."""
    from data.workers import Worker

    with app.db() as session:
        ready = session.query(Worker).filter(Worker.stopped_at.is_(None), Worker.starting.is_(None))
        return {q for w in ready for q in w.queues}


def _wait(what: str, check, seconds: float) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < seconds, f"{what}: not within {seconds} s"
        time.sleep(0.5)
    return time.monotonic() - t0


def test_four_replays_held_by_a_hanging_server_never_delay_another_users_run(tmp_path: Path,
                                                                             fake_vllm) -> None:
    upstream = fake_vllm()  # answers the preflight, then streams keep-alives and never an answer
    with ServedApp(tmp_path, "tiny-llama", worker=True, replays=True, KVNOTES_AUTH="required",
                   KVNOTES_SECRET_KEY=SECRET, KVNOTES_VLLM_URL=f"{upstream.url}/v1",
                   # 8 threads: one user holds at most half (worker.replay_task.FairShare), so 4
                   KVNOTES_REPLAY_THREADS="8", KVNOTES_MAX_ACTIVE_RUNS_PER_USER="4") as app:
        alice, bob = _signed_in(app, "alice"), _signed_in(app, "bob")
        _wait("both workers ready", lambda: _ready(app) == {"model.tiny-llama", "replays"}, 180)
        nid = make_notebook(alice)
        replays = [alice.post(f"/api/notebooks/{nid}/replays", json={}) for _ in range(4)]
        assert [r.status_code for r in replays] == [201] * 4, [r.text for r in replays]
        ids = [r.json()["id"] for r in replays]

        def running() -> list[str]:
            return [alice.get(f"/api/replays/{i}").json()["status"] for i in ids]

        _wait("four replays streaming", lambda: running() == ["running"] * 4 and upstream.completions >= 4,
              120)
        # Alice's cap counts her runs and replays together: a run now is one past it
        capped = alice.post(f"/api/notebooks/{nid}/runs", json={"strategies": ["recompute"]})
        assert capped.status_code == 429 and "runs, trajectories and replays" in capped.text, capped.text

        nb = bob.post("/api/notebooks", json={"title": "bob", "model": "tiny-llama", "text": RECORD})
        nb = nb.json()["id"]
        start = RECORD.index("active")
        assert bob.post(f"/api/notebooks/{nb}/fields", json={"start": start, "end": start + 6,
                                                             "new_value": "banned"}).status_code == 201
        run = bob.post(f"/api/notebooks/{nb}/runs", json={"question": "Can they log in?",
                                                          "choices": ["yes", "no"],
                                                          "strategies": ["recompute", "stale"]})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        took = _wait("Bob's run", lambda: bob.get(f"/api/runs/{run_id}").json()["status"] not in
                     ("queued", "running"), 120)
        assert bob.get(f"/api/runs/{run_id}").json()["status"] == "succeeded"
        assert running() == ["running"] * 4  # ... while Alice's four replays still hang
        print(f"\nBob's run succeeded {took:.1f} s after it was posted, beside 4 hanging replays")
        for i in ids:
            assert alice.post(f"/api/replays/{i}/cancel").status_code == 200
        _wait("the replays' streams closed", lambda: upstream.gone.is_set(), 30)
