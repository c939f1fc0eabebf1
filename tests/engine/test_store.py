"""The KV store on a real folder: prefix reuse across documents, exact round trips, LRU eviction
under a byte budget, and corrupted or truncated files detected, dropped, counted and missed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.conftest import HEAD_DIM, KV_HEADS, MODEL, assert_same, block_files, cut, notes  # noqa: F401
from worker.engine.store import KVStore


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_round_trip_of_whole_sequence_including_partial_tail(store: KVStore, dtype) -> None:
    ids = list(range(100, 150))  # 50 tokens = 3 full blocks of 16 + a 2-token tail
    layers = notes(50, seed=1, dtype=dtype)
    key = store.put(MODEL, ids, layers, segments=["sink"] + ["skill"] * (len(ids) - 1), first_position=3)
    assert store.stats()["blocks"] == 3
    assert_same(store.get(key), layers)
    entry = store.get_entry(key)
    assert entry.token_ids == ids and entry.segments == ["sink"] + ["skill"] * (len(ids) - 1)
    assert entry.first_position == 3
    # a length that is an exact multiple of the block size has an empty tail
    key48 = store.put(MODEL, ids[:48], cut(layers, 48))
    assert_same(store.get(key48), cut(layers, 48))
    assert store.stats()["blocks"] == 3  # the three blocks were shared, not written twice


def test_document_sharing_a_prefix_reuses_its_blocks_and_counts_hits(store: KVStore) -> None:
    shared = list(range(40))  # 2 full blocks + 8 tokens shared
    doc_a = shared + [1000 + i for i in range(30)]
    doc_b = shared + [2000 + i for i in range(30)]
    layers_a = notes(len(doc_a), seed=2)
    store.put(MODEL, doc_a, layers_a)  # 70 tokens: 4 blocks

    n, prefix = store.get_prefix(MODEL, doc_b)  # doc_b: 4 full blocks, the first 2 shared
    assert n == 32
    assert_same(prefix, cut(layers_a, 32))
    s = store.stats()
    assert (s["hits"], s["misses"]) == (2, 2)

    # the same prefix under another model, or after one changed early token, shares nothing
    assert store.get_prefix("other-model", doc_a) == (0, None)
    changed = [7] + doc_a[1:]
    assert store.get_prefix(MODEL, changed)[0] == 0
    n, full = store.get_prefix(MODEL, doc_a)
    assert n == 64
    assert_same(full, cut(layers_a, 64))


def test_lru_eviction_keeps_the_store_inside_its_byte_budget(tmp_path: Path) -> None:
    probe = KVStore(tmp_path / "probe", block_tokens=16)
    probe.put(MODEL, list(range(16)), notes(16, seed=0))
    one_doc = probe.stats()["bytes"]  # one block + its manifest

    store = KVStore(tmp_path / "kv", block_tokens=16, budget_bytes=int(one_doc * 2.5))
    docs = [[d * 100 + i for i in range(16)] for d in range(3)]
    for d, ids in enumerate(docs[:2]):
        store.put(MODEL, ids, notes(16, seed=d))
    assert store.stats()["evictions"] == 0
    assert store.get_prefix(MODEL, docs[0])[0] == 16  # touch doc 0: doc 1 is now least recent
    store.put(MODEL, docs[2], notes(16, seed=2))

    s = store.stats()
    assert s["bytes"] <= store.budget_bytes
    assert s["evictions"] >= 1
    assert store.get_prefix(MODEL, docs[1])[0] == 0  # the least recently used went first
    assert store.get_prefix(MODEL, docs[0])[0] == 16
    assert store.get_prefix(MODEL, docs[2])[0] == 16


def test_flipped_bytes_are_detected_dropped_counted_and_missed(store: KVStore) -> None:
    ids = list(range(32))
    layers = notes(32, seed=3)
    key = store.put(MODEL, ids, layers)
    first = store._path("block", store._block_keys(MODEL, ids)[0])
    data = bytearray(first.read_bytes())
    data[-5] ^= 0xFF  # inside the last tensor's bytes: the file still parses
    first.write_bytes(bytes(data))

    assert store.get_prefix(MODEL, ids) == (0, None)
    assert not first.exists()
    s = store.stats()
    assert s["corrupt"] == 1 and s["blocks"] == 1
    assert store.get(key) is None  # the whole sequence needs the dropped block

    store.put(MODEL, ids, layers)  # recomputed notes are put back and served again
    assert_same(store.get(key), layers)


def test_truncated_file_is_detected_dropped_counted_and_missed(store: KVStore) -> None:
    ids = list(range(32))
    store.put(MODEL, ids, notes(32, seed=4))
    second = store._path("block", store._block_keys(MODEL, ids)[1])
    second.write_bytes(second.read_bytes()[:-100])

    n, prefix = store.get_prefix(MODEL, ids)
    assert n == 16 and prefix[0][0].shape == (KV_HEADS, 16, HEAD_DIM)
    assert not second.exists()
    assert store.stats()["corrupt"] == 1
    # a file cut inside its header is caught the same way
    first = store._path("block", store._block_keys(MODEL, ids)[0])
    first.write_bytes(first.read_bytes()[:20])
    assert store.get_prefix(MODEL, ids) == (0, None)
    assert store.stats()["corrupt"] == 2


def test_stats_are_shared_by_two_store_objects_on_one_folder(tmp_path: Path) -> None:
    a = KVStore(tmp_path / "kv", block_tokens=16)
    b = KVStore(tmp_path / "kv", block_tokens=16)
    a.put(MODEL, list(range(16)), notes(16, seed=5))
    assert b.get_prefix(MODEL, list(range(16)))[0] == 16
    assert a.stats()["hits"] == 1 and a.stats()["blocks"] == 1


def test_shapes_are_checked(store: KVStore) -> None:
    with pytest.raises(ValueError, match="layer 0"):
        store.put(MODEL, list(range(10)), notes(9, seed=6))
    # a transformers-style [1, kv_heads, T, head_dim] cache layer is accepted
    layers4 = [(k[None], v[None]) for k, v in notes(20, seed=7)]
    key = store.put(MODEL, list(range(20)), layers4)
    assert_same(store.get(key), [(k[0], v[0]) for k, v in layers4])
