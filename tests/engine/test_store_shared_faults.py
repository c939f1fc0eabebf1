"""A fault of the shared KV tier is a miss, never a failed lookup (issue 40), on a real SeaweedFS of
each test's own (scripts/s3.sh), stopped, damaged or pointed at what does not answer.

Each fault leaves the lookup with what the local folder has (0 tokens here), `last_reuse` naming
the fault ("unreachable", "missing bucket", "damaged"); a damaged object is deleted; a stopped server
started again is used again without a new store (the tier is tried again after `retry_s`)."""

from __future__ import annotations

import socket
import threading
import time

import obstore
import pytest
from obstore.store import S3Store

from tests.engine.conftest import MODEL, assert_same, block_files, cut, notes
from tests.s3 import REDIS_URL, S3Server, objects, seaweedfs, shared_store
from worker.engine.store import KVStore
from worker.engine.store_s3 import SharedConfig, parse_store_url
from worker.engine.store_tiers import SharedIndex

IDS = list(range(500, 564))  # 64 tokens: 4 blocks of 16 and an empty tail


@pytest.fixture
def own_server(tmp_path_factory):
    with seaweedfs(tmp_path_factory.mktemp("s3-own")) as server:
        yield server


def written(tmp_path, server: S3Server, url: str) -> KVStore:
    """Host A's store with IDS written through to the shared tier."""
    a = shared_store(tmp_path / "a", server, url, retry_s=0.5)
    a.put(MODEL, IDS, notes(64, seed=7))
    assert a.flush(60)
    return a


def rewrite(server: S3Server, path: str, data: bytes) -> None:
    bucket, _ = parse_store_url(server.env["KVNOTES_STORE_URL"])
    s3 = S3Store(bucket, endpoint=server.endpoint, region="us-east-1", virtual_hosted_style_request=False,
                 client_options={"allow_http": True})
    obstore.put(s3, path, data)


def test_a_stopped_tier_is_a_miss_said_once_and_comes_back_without_a_restart(tmp_path, own_server,
                                                                             caplog) -> None:
    url = own_server.store_url()
    written(tmp_path, own_server, url)
    b = shared_store(tmp_path / "b", own_server, url, retry_s=0.5, timeout_s=2.0)
    own_server.stop()
    n, layers = b.get_prefix(MODEL, IDS)
    assert (n, layers) == (0, None)
    assert b.last_reuse.to_dict() == {"tokens": 0, "tier": "none", "shared_tier": "unreachable"}
    b.put(MODEL, [9] * 20, notes(20, seed=1))  # a write while down: local at once, shared dropped
    assert b.flush(30) and b.get_prefix(MODEL, [9] * 20)[0] == 16
    time.sleep(0.6)
    assert b.get_prefix(MODEL, IDS)[0] == 0  # tried again (past retry_s), still down: not logged again
    said = [r for r in caplog.records if getattr(r, "fault", None) == "unreachable"]
    assert len(said) == 1
    own_server.start()
    for _ in range(60):  # the same store: a lookup after retry_s tries the tier again
        time.sleep(0.6)
        n, layers = b.get_prefix(MODEL, IDS)
        if n:
            break
    assert n == 64 and b.last_reuse.tier == "shared" and not b.last_reuse.shared_fault
    assert_same(layers, cut(notes(64, seed=7), 64))
    SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_object_is_a_miss_and_is_deleted(tmp_path, own_server, damage) -> None:
    url = own_server.store_url()
    a = written(tmp_path, own_server, url)
    key = a._block_keys(MODEL, IDS)[0]
    first = a.shared.tier.path("block", key)
    body = a._path("block", key).read_bytes()  # the local file: the object's bytes
    rewrite(own_server, first, b"not a safetensors file" if damage == "garbage" else body[: len(body) // 2])
    b = shared_store(tmp_path / "b", own_server, url)
    assert b.get_prefix(MODEL, IDS)[0] == 0
    assert b.last_reuse.shared_fault == "damaged"
    assert b.flush(60)  # the delete and the index's update are the writer thread's
    assert first not in objects(own_server, url)  # deleted from the tier
    assert b._path("block", key) not in block_files(b)  # and never kept locally
    assert len(block_files(b)) == 3  # the sound rest of the chain, fetched with it, verified and kept
    assert b.shared_stats()["damaged"] == 1
    SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()


def test_a_missing_bucket_is_a_miss_that_says_so(tmp_path, own_server) -> None:
    b = shared_store(tmp_path / "b", own_server, "s3://no-such-bucket-kv/x")
    assert b.get_prefix(MODEL, IDS) == (0, None)
    assert b.last_reuse.shared_fault == "missing bucket"


def test_a_tier_that_never_answers_is_a_miss_after_the_request_timeout(tmp_path, own_server) -> None:
    """A listener that accepts and never answers: each request ends at `timeout_s`, not never."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        config = SharedConfig(url="s3://kvnotes/silent", endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}",
                              timeout_s=1.0)
        b = KVStore(tmp_path / "b", block_tokens=16, shared=config)
        started = time.monotonic()
        assert b.get_prefix(MODEL, IDS) == (0, None)
        elapsed = time.monotonic() - started
        assert b.last_reuse.shared_fault == "unreachable"
        # generous: the bound is 1 s; a loaded machine adds scheduling delay, never another timeout
        assert elapsed < 15, elapsed
    finally:
        stop.set()
        for conn in held:
            conn.close()
        silent.close()
