"""The KV store's shared tier on a real SeaweedFS (scripts/s3.sh; issue 40): two stores with separate
local folders behind one bucket, the way two workers on two hosts are.

What comes from the shared tier is exact and kept locally; a compiled skill is fetched by its key on
the other host; two stores writing one block store one object; the byte budget evicts
least-recently-used objects (Redis index); keys do not depend on the process's hash seed."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from tests.engine.conftest import MODEL, assert_same, block_files, cut, notes
from tests.s3 import REDIS_URL, objects, shared_store
from worker.engine.store_tiers import SharedIndex


def test_a_second_host_reads_the_first_hosts_notes_exactly_and_keeps_them(tmp_path, s3_server) -> None:
    url = s3_server.store_url()
    a = shared_store(tmp_path / "a", s3_server, url)
    b = shared_store(tmp_path / "b", s3_server, url)
    ids = list(range(1000, 1070))  # 70 tokens: 4 blocks of 16 + a 6-token tail
    layers = notes(70, seed=3)
    assert a.put(MODEL, ids, layers) is not None  # the skill's prefill, then the skill kept (segments)
    assert a.flush(60)
    skill_key = a.put(MODEL, ids, layers, segments=["sink"] + ["skill"] * 69, first_position=2)
    assert a.flush(60)
    assert len(objects(s3_server, url)) == 5  # 4 blocks + the sequence's manifest

    n, prefix = b.get_prefix(MODEL, ids + [7, 8, 9])
    assert n == 64 and b.last_reuse.tier == "shared" and b.last_reuse.tokens == 64
    assert_same(prefix, cut(layers, 64))
    assert len(block_files(b)) == 4  # kept locally
    b.get_prefix(MODEL, ids)
    assert b.last_reuse.tier == "local" and b.last_reuse.tokens == 64

    c = shared_store(tmp_path / "c", s3_server, url)  # a third host fetches the skill by its key alone
    entry = c.get_entry(skill_key)
    assert entry is not None and entry.token_ids == ids and entry.first_position == 2
    assert entry.segments == ["sink"] + ["skill"] * 69
    assert_same(entry.layers, layers)
    assert c.last_reuse.tier == "shared"
    stats = c.shared_stats()
    assert stats["hits"] >= 4 + 5 and stats["objects"] == 5  # b's 4 blocks, c's 4 blocks + manifest
    SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()


def test_two_hosts_writing_the_same_blocks_store_one_object_each(tmp_path, s3_server) -> None:
    url = s3_server.store_url()
    ids, layers = list(range(64)), notes(64, seed=4)
    stores = [shared_store(tmp_path / name, s3_server, url) for name in ("a", "b")]
    for store in stores:
        store.put(MODEL, ids, layers)
    assert all(store.flush(60) for store in stores)
    found = objects(s3_server, url)
    assert len(found) == 4 + 1  # 4 blocks and one manifest, each once
    assert stores[0].shared_stats()["bytes"] == sum(found.values())
    SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()


def test_the_budget_evicts_least_recently_used_objects(tmp_path, s3_server) -> None:
    url = s3_server.store_url()
    probe = shared_store(tmp_path / "probe", s3_server, s3_server.store_url())
    probe.put(MODEL, list(range(16)), notes(16, seed=5))
    probe.flush(60)
    block = next(iter(objects(s3_server, probe.shared.config.url).values()))
    a = shared_store(tmp_path / "a", s3_server, url, budget_bytes=14 * block)
    docs = [[d * 1000 + i for i in range(64)] for d in range(4)]  # 4 x (4 blocks + a manifest)
    for d, ids in enumerate(docs):
        a.put(MODEL, ids, notes(64, seed=d))
        assert a.flush(60)
        if d == 1:
            b = shared_store(tmp_path / "b", s3_server, url)
            assert b.get_prefix(MODEL, docs[0])[0] == 64  # doc 0 used again: the newest now
            assert b.flush(60)  # its index update (the use) is the writer thread's
    left = objects(s3_server, url)
    stats = a.shared_stats()
    # 16 blocks and 4 manifests (each under a third of a block) over a budget of 14 blocks: the
    # least recently used go, down to 90% of the budget (the low watermark), so one eviction takes
    # 5 objects where fitting the budget alone took 4: doc 0's manifest and doc 1's first 4 blocks
    assert stats["evictions"] == 5 and sum(left.values()) <= 14 * block and len(left) == 20 - 5
    assert stats["bytes"] == sum(left.values())
    c = shared_store(tmp_path / "c", s3_server, url)
    assert c.get_prefix(MODEL, docs[0])[0] == 64  # recently used: kept
    assert c.get_prefix(MODEL, docs[1])[0] == 0  # least recently used: gone
    for u in (url, probe.shared.config.url):
        SharedIndex(REDIS_URL, u.removeprefix("s3://")).clear()


def test_block_keys_are_the_same_under_any_hash_seed(tmp_path) -> None:
    code = ("from pathlib import Path; from worker.engine.store import KVStore; "
            f"store = KVStore(Path({str(tmp_path)!r}), block_tokens=16); "
            "print(store._block_keys('m:float32', list(range(40))))")
    seen = {subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(seen) == 1 and seen.pop().count("'") == 4  # two 64-hex keys, equal across processes
