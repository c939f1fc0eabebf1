"""`kvnotes serve` as an operator meets it, as real processes: a refused start on a public address
without a secret key or a user; and on loopback, a worker killed with SIGKILL is replaced within
30 s under a new name (health answering 503 in between, naming the model), a run afterwards
succeeds even with the KV store's index deleted, and a `serve` killed with SIGKILL takes its
worker with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port as _free_port
from tests.conftest import kvnotes_cli as _kvnotes
from tests.conftest import kvnotes_env, until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
DOC = "The customer record: name Alice, age 31, status active. Only active accounts may log in. "


def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split(") ")[-1][0] != "Z"


def _worker_row(env: dict[str, str], replays: bool = False) -> tuple[str, int] | None:
    """(name, pid) of the live model worker the registry knows (with `replays`, of the replays'
    worker: serve supervises both), or None."""
    import sqlite3

    db = Path(env["KVNOTES_DATA"]) / "kvnotes.db"
    which = "LIKE" if replays else "NOT LIKE"
    with sqlite3.connect(db) as c:
        row = c.execute(f"SELECT name, pid FROM workers WHERE stopped_at IS NULL AND queues {which} "
                        "'%\"replays\"%' ORDER BY started_at DESC").fetchone()
    return (row[0], row[1]) if row else None


def test_serve_refuses_a_public_address_without_a_secret_key_or_a_user(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("KVNOTES_SECRET_KEY", None)
    done = _kvnotes("serve", "--host", "0.0.0.0", "--port", str(_free_port()), "--no-worker", env=env)
    assert done.returncode == 2 and "KVNOTES_SECRET_KEY" in done.stderr and "kvnotes users add" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    env["KVNOTES_SECRET_KEY"] = "Vq3xR8mZ2pLw9TfK7cYb4NhJ6sGd1EaU5oXi0QrW"
    done = _kvnotes("serve", "--host", "0.0.0.0", "--port", str(_free_port()), "--no-worker", env=env)
    assert done.returncode == 2 and "kvnotes users add NAME" in done.stderr
    assert _kvnotes("users", "add", "ops", "--password-stdin", env=env,
                    stdin="a-long-password\n").returncode == 0
    token = _kvnotes("tokens", "create", "ops", env=env)
    assert (token.returncode == 0 and token.stdout.strip().startswith("kvn_")
            and len(token.stdout.splitlines()) == 1)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve", "--host", "0.0.0.0",
                               "--port", str(port), "--no-worker"],
                              env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        until("the app", lambda: _get_or_none(base + "/api/health"), 90)  # a loaded machine: slow imports
        assert _get(base + "/api/notebooks")[0] == 401  # a public bind: sign-in required even from loopback
        assert _get(base + "/api/notebooks", token.stdout.strip())[0] == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


def _get_or_none(url: str):
    try:
        return _get(url)
    except OSError:
        return None


def _restarted_health_does_not_trust_the_killed_worker(env: dict[str, str]) -> None:
    """Right after `kill -9` of serve, a restarted app (no worker of its own yet) must not answer
    "ok" on the killed worker's last beat, which is seconds old: its process is gone."""
    port = _free_port()
    command = [sys.executable, "-m", "commands.cli", "serve", "--port", str(port), "--no-worker"]
    again = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    health = f"http://127.0.0.1:{port}/api/health"
    try:
        status, body = until("the restarted app", lambda: _get_or_none(health), 90)
        assert status == 503 and body["workers"] == f"no live worker for {MODEL}", body
    finally:
        again.terminate()
        again.wait(timeout=30)


def test_a_killed_worker_is_replaced_and_a_killed_serve_leaves_no_worker(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path, KVNOTES_DEFAULT_MODEL=MODEL, KVNOTES_MODELS=MODEL,
                                       KVNOTES_DEVICE="cpu"), "PYTHONPATH": str(REPO)}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve",
                              "--port", str(port), "--model", MODEL],
                             env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        until("a healthy start", lambda: (_get_or_none(base + "/api/health") or (0,))[0] == 200, 90)
        _, replays_pid = until("the replays' worker", lambda: _worker_row(env, replays=True), 60)
        name, pid = _worker_row(env)
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        status, body = until("a 503 health", lambda: (r := _get(base + "/api/health"))[0] == 503 and r, 10)
        assert body["workers"] == f"no live worker for {MODEL}" and body["status"] == "degraded"
        # a replacement boots, registers and loads its model before health is "ok" (a loaded
        # machine takes longer than the 30 s a quiet one needs)
        until("a healthy replacement", lambda: _get(base + "/api/health")[0] == 200, 90)
        replaced_after = time.monotonic() - t_kill
        new_name, new_pid = _worker_row(env)
        assert new_name != name and new_pid != pid
        # the KV store is only a cache
        (Path(env["KVNOTES_DATA"]) / "kv" / "index.sqlite").unlink(missing_ok=True)
        nb = _post(base + "/api/notebooks", {"title": "t", "model": MODEL, "text": DOC})[1]["id"]
        field = {"start": DOC.index("active"), "end": DOC.index("active") + 6,
                 "new_value": "banned", "label": "status"}
        assert _post(f"{base}/api/notebooks/{nb}/fields", field)[0] == 201
        run = _post(f"{base}/api/notebooks/{nb}/runs",
                    {"question": "Can Alice log in?", "choices": ["yes", "no"],
                     "strategies": ["recompute", "stale"]})[1]
        done = until("the run", lambda: (r := _get(f"{base}/api/runs/{run['id']}")[1])["status"] in
                     ("succeeded", "failed") and r, 90)
        assert done["status"] == "succeeded", done["error"]
        assert done["worker"] == new_name
        print(f"\nworker replaced {replaced_after:.1f} s after SIGKILL")
        serve.send_signal(signal.SIGKILL)
        serve.wait()
        until("the worker to die with serve", lambda: not _alive(new_pid), 10, every=0.1)
        until("the replays' worker to die with serve", lambda: not _alive(replays_pid), 10, every=0.1)
        _restarted_health_does_not_trust_the_killed_worker(env)
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
