"""Two real workers, one shared KV store (issue 40's done-when): `kvnotes` workers with separate data
folders sharing one PostgreSQL, one Redis broker and one SeaweedFS from scripts/s3.sh.

Worker A runs an edit of a ~1,500-token document and is stopped. Worker B's run of the same edit
reads the document's notes from the shared tier (store_reuse.tier "shared", at least 90% of the
document's tokens), and every strategy's decision equals A's. With SeaweedFS stopped, a run on B of
a document B has not seen succeeds, prefilled, and its detail says the shared tier was unreachable.
"""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from tests.conftest import ServedApp, api_call, api_notebook, stop_process, until
from tests.s3 import seaweedfs

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"  # a byte tokenizer: one token per character
RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          + "Only accounts whose status is active may log in. " * 29)  # ~1,500 tokens
OTHER = RECORD.replace("Dana Lee", "Kim Park").replace("business", "personal")
STRATEGIES = ["recompute", "erratum", "in_place"]
REDIS_DB = 14  # this test's broker and result backend (flushed before and after)
WAIT_S = 300


def _until(what: str, check, timeout: float = WAIT_S, every: float = 0.25):
    return until(what, check, timeout, every)


def _worker(server: ServedApp, data: Path, name: str) -> subprocess.Popen:
    """A real worker with its own data folder, the shared store's variables, ready when its row says."""
    from commands.supervisor import worker_command
    from data.workers import Worker

    data.mkdir(parents=True, exist_ok=True)
    env = {**server.env, "KVNOTES_DATA": str(data)}  # the shared store's variables: the server's
    proc = subprocess.Popen(worker_command([MODEL], f"{name}@%h"), env=env, cwd=server.env["PYTHONPATH"],
                            stdout=server._out, stderr=subprocess.STDOUT)

    def ready() -> bool:
        with server.db() as s:
            row = s.scalar(select(Worker).where(Worker.name.like(f"{name}@%"), Worker.pid == proc.pid))
            return row is not None and row.starting is None and row.stopped_at is None
    _until(f"worker {name} ready", ready)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    """Warm shutdown: the worker finishes, waits for its background writes (atexit) and exits."""
    stop_process(proc, 60)


def _edit(api: str, text: str) -> dict:
    """A notebook over `text` whose status becomes "suspended", and one run of it, finished."""
    return _run(api, api_notebook(api, text, "access", ("active", "suspended", "status"), MODEL))


def _run(api: str, nb: int) -> dict:
    run = api_call(f"{api}/notebooks/{nb}/runs", "POST",
                   {"question": "Can Dana log in?", "choices": ["yes", "no"], "strategies": STRATEGIES})

    def done():
        now = api_call(f"{api}/runs/{run['id']}")
        return now if now["status"] not in ("queued", "running") else None
    run = _until(f"run {run['id']}", done, every=1.0)
    assert run["status"] == "succeeded", run["error"]
    return run


def _decisions(run: dict) -> dict[str, str]:
    return {name: r["decision"] for name, r in run["results"].items()}


def test_a_second_worker_reuses_the_first_workers_notes_through_the_shared_tier(
        tmp_path: Path, postgres_url: str) -> None:
    broker = f"redis://127.0.0.1:6379/{REDIS_DB}"
    redis.Redis.from_url(broker).flushdb()
    with seaweedfs(tmp_path / "s3") as s3:
        shared = {**s3.env, "KVNOTES_STORE_URL": s3.store_url()}
        (tmp_path / "web").mkdir()
        with ServedApp(tmp_path / "web", MODEL, worker=False, DATABASE_URL=postgres_url, BROKER_URL=broker,
                       RESULT_BACKEND=broker, **shared) as server:
            api = f"{server.url}/api"
            a = _worker(server, tmp_path / "a", "store-a")
            try:
                first = _edit(api, RECORD)
            finally:
                _stop(a)
            assert first["worker"].startswith("store-a@")
            assert first["store_reuse"] == {"tokens": 0, "tier": "none", "shared_tier": ""}
            assert not list((tmp_path / "b").glob("kv/blocks/*/*"))  # B has nothing of its own

            b = _worker(server, tmp_path / "b", "store-b")
            try:
                second = _run(api, first["notebook_id"])
                assert second["worker"].startswith("store-b@")
                n_tokens = len(RECORD) + 20  # the document and its chat frame: at least this many tokens
                reuse = second["store_reuse"]
                assert reuse["tier"] == "shared" and reuse["tokens"] >= 0.9 * n_tokens, reuse
                assert _decisions(second) == _decisions(first)
                with urllib.request.urlopen(f"{server.url}/runs/{second['id']}", timeout=60) as response:
                    page = response.read().decode()
                assert f"{reuse['tokens']} tokens from the shared store" in page
                export = api_call(f"{server.url}/runs/{second['id']}/export.json")
                assert export["run"]["store_reuse"] == reuse

                s3.stop()
                down = _edit(api, OTHER)  # a document B has not seen: the lookup reaches the tier
                assert down["worker"].startswith("store-b@")
                assert down["store_reuse"] == {"tokens": 0, "tier": "none", "shared_tier": "unreachable"}
                assert set(down["results"]) == set(first["results"])
            finally:
                _stop(b)
    redis.Redis.from_url(broker).flushdb()
