"""The replays' threads are shared fairly across users (issue 41: 8 of one user's replays hung on
a server that never answers held all 4 threads, and another user's replay on a healthy server
waited 234.8 s). A served app, its replays' worker (4 threads) and two real HTTP peers: one that
answers the preflight and then streams keep-alives forever, one that answers as vLLM does.

Alice posts 8 replays to the hanging server; at no look do more than 2 of them (half the threads)
run. Bob's replay on the healthy server, posted after them, succeeds within 30 s (the figure the
issue asks for; its requests take well under a second on an idle machine). The replay deadline is
set far away (600 s), so only the fair share can let Bob through."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServedApp, kvnotes_cli
from tests.serving.conftest import make_notebook
from tests.serving.engines import Engine

pytestmark = pytest.mark.slow
SECRET = "s" * 16 + "-not-a-real-secret-but-long-enough-for-tests"
HUNG = 8
BOB_WITHIN_S = 30.0


def _signed_in(app: ServedApp, name: str) -> httpx.Client:
    added = kvnotes_cli("users", "add", name, "--password-stdin", env=app.env, stdin="a long password\n")
    assert added.returncode == 0, added.stderr
    token = kvnotes_cli("tokens", "create", name, env=app.env).stdout.strip()
    return httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_one_users_hung_replays_hold_half_the_threads_and_another_users_replay_runs(tmp_path: Path) -> None:
    hung, healthy = Engine(fault="trickle", delay_s=0.5), Engine()
    try:
        with ServedApp(tmp_path, "tiny-llama", replays=True, KVNOTES_AUTH="required",
                       KVNOTES_SECRET_KEY=SECRET, KVNOTES_VLLM_URL=f"{hung.url}/v1,{healthy.url}/v1",
                       KVNOTES_REPLAY_THREADS="4",
                       KVNOTES_REPLAY_DEADLINE="600", KVNOTES_MAX_ACTIVE_RUNS_PER_USER="10") as app:
            alice, bob = _signed_in(app, "alice"), _signed_in(app, "bob")
            mine = make_notebook(alice)
            posted = [alice.post(f"/api/notebooks/{mine}/replays", json={"url": f"{hung.url}/v1"})
                      for _ in range(HUNG)]
            assert [r.status_code for r in posted] == [201] * HUNG, [r.text for r in posted]
            ids = [r.json()["id"] for r in posted]

            def running() -> int:
                return sum(alice.get(f"/api/replays/{i}").json()["status"] == "running" for i in ids)

            t0 = time.monotonic()
            while running() < 2:
                assert time.monotonic() - t0 < 120, "Alice's replays never started"
                time.sleep(0.5)
            theirs = make_notebook(bob)
            replay = bob.post(f"/api/notebooks/{theirs}/replays", json={"url": f"{healthy.url}/v1"})
            assert replay.status_code == 201, replay.text
            posted_at, most = time.monotonic(), 0
            while (status := bob.get(f"/api/replays/{replay.json()['id']}").json()["status"]) in ("queued",
                                                                                                "running"):
                most = max(most, running())
                assert time.monotonic() - posted_at < BOB_WITHIN_S, f"Bob's replay still {status}"
                time.sleep(0.5)
            took = time.monotonic() - posted_at
            assert status == "succeeded", bob.get(f"/api/replays/{replay.json()['id']}").json()
            assert most <= 2 and running() == 2  # half the threads, still hung
            print(f"\nBob's replay succeeded {took:.1f} s after it was posted, beside {HUNG} hung replays "
                  f"of Alice's ({most} of them running at most)")
            for i in ids:
                assert alice.post(f"/api/replays/{i}/cancel").status_code == 200
    finally:
        hung.close()
        healthy.close()


def test_a_hung_replays_deadline_frees_its_thread_for_the_next(tmp_path: Path) -> None:
    """Two threads (a share of one each user): Alice's first replay hangs until its deadline (6 s),
    fails saying so, and its thread takes her second, which waited meanwhile."""
    hung = Engine(fault="trickle", delay_s=0.5)
    try:
        with ServedApp(tmp_path, "tiny-llama", replays=True, KVNOTES_VLLM_URL=f"{hung.url}/v1",
                       KVNOTES_REPLAY_THREADS="2", KVNOTES_REPLAY_DEADLINE="6") as app:
            client = httpx.Client(base_url=app.url, timeout=60)
            nid = make_notebook(client)
            ids = [client.post(f"/api/notebooks/{nid}/replays", json={}).json()["id"] for _ in range(2)]

            def rows() -> list[dict]:
                return [client.get(f"/api/replays/{i}").json() for i in ids]

            t0, seen = time.monotonic(), set()
            while (now := rows())[1]["status"] == "queued" or now[0]["status"] in ("queued", "running"):
                seen.add(tuple(r["status"] for r in now))
                assert ("running", "running") not in seen  # one thread each user: a share of one
                assert time.monotonic() - t0 < 60, now
                time.sleep(0.5)
            first, second = rows()
            assert first["status"] == "failed" and "KVNOTES_REPLAY_DEADLINE" in first["error"], first
            assert second["status"] in ("running", "failed"), second  # it got the thread
            client.post(f"/api/replays/{ids[1]}/cancel")
    finally:
        hung.close()
