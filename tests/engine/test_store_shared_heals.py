"""The shared KV tier is bounded and heals (issue 49), on a real SeaweedFS and a real Redis.

- With the bucket paused (SIGSTOP), prefilling 12 different 2,000-token documents keeps the upload
  queue under its byte bound; the drops are counted in the index (and `kvnotes store` shows them,
  tests/worker/test_cli_store.py); `close` with the bucket still paused abandons the queue and says
  so, and its writer thread is gone.
- After the bucket is emptied, the first lookup resets the index and the next worker's put uploads
  again: the third run (a third host) reads the document from the shared tier.
- An object overwritten with garbage is dropped from the index when found, and the worker still
  holding it uploads it again on its next put.
- A hanging index (a listener that accepts and never answers) costs one timeout, then is skipped
  for `retry_s` by the breaker; eviction's lock is released only by its own token.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import obstore
import pytest
import redis
from obstore.store import S3Store

from tests.conftest import kvnotes_cli, kvnotes_env
from tests.engine.conftest import MODEL, notes
from tests.s3 import REDIS_URL, S3Server, objects, seaweedfs, shared_store, silent_listener
from worker.engine.store_s3 import parse_store_url
from worker.engine.store_tiers import SharedIndex

IDS = list(range(500, 564))  # 64 tokens: 4 blocks of 16


@pytest.fixture
def own_server(tmp_path_factory):
    with seaweedfs(tmp_path_factory.mktemp("s3-own")) as server:
        yield server


def _clear(url: str) -> None:
    SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()


def _s3(server: S3Server) -> S3Store:
    bucket, _ = parse_store_url(server.env["KVNOTES_STORE_URL"])
    return S3Store(bucket, endpoint=server.endpoint, region="us-east-1", virtual_hosted_style_request=False,
                   client_options={"allow_http": True})


def _empty(server: S3Server, url: str) -> None:
    s3 = _s3(server)
    for path in objects(server, url):
        obstore.delete(s3, path)
    assert objects(server, url) == {}


@contextmanager
def paused(server: S3Server) -> Iterator[None]:
    """SeaweedFS stopped in place (SIGSTOP): connections are accepted by the kernel, never answered."""
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)


def test_a_paused_bucket_keeps_the_upload_queue_under_its_byte_bound(tmp_path, own_server) -> None:
    url = own_server.store_url()
    probe = shared_store(tmp_path / "probe", own_server, url)
    probe.put(MODEL, list(range(16)), notes(16, seed=1))
    assert probe.flush(60)
    block = probe.shared_stats()["bytes"] - 0  # one block and a tiny manifest
    bound = 20 * block
    a = shared_store(tmp_path / "a", own_server, url, upload_bytes=bound, timeout_s=1.0, retry_s=2.0)
    with paused(own_server):
        for d in range(12):  # 12 different 2,000-token documents: 125 blocks of 16 each
            a.put(MODEL, [d * 10_000 + i for i in range(2000)], notes(2000, seed=d))
            assert a.shared.tier.counters.queued_bytes <= bound
        stats = a.shared_stats()
        assert stats["process_peak_bytes"] <= bound
        assert stats["process_dropped"] >= 12 * 125 - 20  # all but what the queue could hold
        said = a.close(drain=True, timeout_s=1.0)  # still paused: what is left is abandoned, said
        assert said == "drained" or said.startswith("abandoned "), said
        assert not a.shared.tier._writer.is_alive()
    counted = probe.shared_stats()
    assert counted["dropped"] >= 12 * 125 - 20, counted  # in the index: every worker sees them
    env = {**kvnotes_env(tmp_path / "cli"), **own_server.env, "KVNOTES_STORE_INDEX": REDIS_URL}
    shown = kvnotes_cli("store", "--store", url, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[1]["dropped"] == counted["dropped"]
    table = kvnotes_cli("store", "--store", url, env=env).stdout
    assert f"uploads: {counted['dropped']} dropped" in table, table
    assert not a.shared.tier.put_later("x", b"after close")  # a closed queue takes nothing
    _clear(url)


def test_after_the_bucket_is_emptied_the_third_run_reads_the_shared_tier_again(tmp_path, own_server) -> None:
    url = own_server.store_url()
    a = shared_store(tmp_path / "a", own_server, url)
    layers = notes(70, seed=7)
    ids = IDS + [1, 2, 3, 4, 5, 6]  # 4 blocks and a 6-token tail, as a prefill puts it
    a.put(MODEL, ids, layers)
    assert a.flush(60)
    _empty(own_server, url)
    assert a.shared_stats()["objects"] == 5  # the index still lists them

    b = shared_store(tmp_path / "b", own_server, url)  # the first run after: a miss ...
    assert b.get_prefix(MODEL, ids)[0] == 0
    b.put(MODEL, ids, layers)  # ... prefilled and put, as every run does
    assert b.flush(60)
    assert len(objects(own_server, url)) == 5  # uploaded again: the index was reset, not trusted
    assert b.shared_stats()["objects"] == 5

    c = shared_store(tmp_path / "c", own_server, url)  # the next run, on another host
    assert c.get_prefix(MODEL, ids)[0] == 64 and c.last_reuse.tier == "shared"
    _clear(url)


def test_a_damaged_object_is_uploaded_again_by_the_worker_holding_it(tmp_path, own_server) -> None:
    url = own_server.store_url()
    a = shared_store(tmp_path / "a", own_server, url)
    layers = notes(70, seed=8)
    ids = IDS + [1, 2, 3, 4, 5, 6]
    a.put(MODEL, ids, layers)
    assert a.flush(60)
    s3 = _s3(own_server)
    for key in a._block_keys(MODEL, ids):  # every block overwritten with garbage
        obstore.put(s3, a.shared.tier.path("block", key), b"garbage")

    b = shared_store(tmp_path / "b", own_server, url)
    assert b.get_prefix(MODEL, ids)[0] == 0 and b.last_reuse.shared_fault == "damaged"
    assert b.flush(60)
    assert b.shared_stats()["objects"] == 1  # all four dropped from the index in one lookup
    a.put(MODEL, ids, layers)  # the worker holding them runs the document again
    assert a.flush(60)
    c = shared_store(tmp_path / "c", own_server, url)
    assert c.get_prefix(MODEL, ids)[0] == 64 and c.last_reuse.tier == "shared"
    _clear(url)


def test_a_hanging_index_costs_one_timeout_then_is_skipped(tmp_path) -> None:
    with silent_listener() as port:
        index = SharedIndex(f"redis://127.0.0.1:{port}/0", "kvnotes/hang", timeout_s=0.5, retry_s=30)
        started = time.monotonic()
        assert index.record("a", 1) == -1
        first = time.monotonic() - started
        assert index.breaker.state == "open"
        started = time.monotonic()
        for _ in range(50):  # skipped by the breaker: none of these reaches the socket
            assert index.known(["a"]) is None and index.stats() == {}
            index.after_lookup(["a"], hits=1)
        assert time.monotonic() - started < first  # 50 x 3 calls in less than the one timeout


def test_the_eviction_lock_is_released_only_by_its_own_token(tmp_path) -> None:
    index = SharedIndex(REDIS_URL, "kvnotes/evict-lock-test")
    index.clear()
    r = redis.Redis.from_url(REDIS_URL)
    for i in range(10):
        index.record(f"p{i}", 100)
    r.set("kvnotes:kv:kvnotes/evict-lock-test:evicting", "another worker's", ex=30)
    assert index.over_budget(500) == []  # another worker holds the lock: nothing evicted
    assert r.get("kvnotes:kv:kvnotes/evict-lock-test:evicting") == b"another worker's"
    r.delete("kvnotes:kv:kvnotes/evict-lock-test:evicting")
    victims = index.over_budget(500)  # 1,000 bytes over a 500 budget: down to 450 (90%)
    assert victims == [f"p{i}" for i in range(6)]
    assert index.stats()["bytes"] == 400 and r.get("kvnotes:kv:kvnotes/evict-lock-test:evicting") is None
    index.clear()
