"""The KV store is a cache: a deleted or damaged index, a full disk, or several damaged blocks never
fail a lookup or a write (and so never a run); the index is quarantined and rebuilt from the files,
each failure is logged once, and every damaged block a lookup meets is healed at once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.conftest import tmpfs
from tests.engine.conftest import MODEL, assert_same, block_files, cut, notes
from worker.engine.store import KVStore


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "kv store" in r.getMessage()]


def test_a_deleted_index_is_rebuilt_from_the_files_and_lookups_still_hit(tmp_path: Path, caplog) -> None:
    store = KVStore(tmp_path / "kv", block_tokens=16)
    ids, layers = list(range(48)), notes(48, seed=1)
    store.put(MODEL, ids, layers)
    (store.root / "index.sqlite").unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(store.root / "index.sqlite") + suffix).unlink(missing_ok=True)
    with caplog.at_level(logging.WARNING):
        n, prefix = store.get_prefix(MODEL, ids)  # the failing call itself answers "miss"
        assert (n, prefix) == (0, None)
        n, prefix = store.get_prefix(MODEL, ids)  # then the rebuilt index serves the files again
    assert n == 48 and prefix is not None
    assert_same(prefix, cut(layers, 48))
    assert store.stats()["blocks"] == 3
    assert sum("failed" in m for m in _warnings(caplog)) == 1


def test_a_damaged_index_is_quarantined_and_a_put_still_works(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv", block_tokens=16)
    store.put(MODEL, list(range(32)), notes(32, seed=2))
    (store.root / "index.sqlite").write_bytes(b"this is not a database" * 100)
    key = store.put(MODEL, list(range(100, 132)), notes(32, seed=3))  # fails quietly: a miss
    assert key is None
    key = store.put(MODEL, list(range(100, 132)), notes(32, seed=3))
    assert key is not None and store.get(key) is not None
    assert list((store.root / "quarantine").glob("index-*.sqlite"))
    assert store.stats()["blocks"] == 4  # two rebuilt from the files, two just written


def test_every_damaged_block_met_is_healed_in_one_lookup(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "kv", block_tokens=16)
    ids, layers = list(range(64)), notes(64, seed=4)
    store.put(MODEL, ids, layers)
    keys = store._block_keys(MODEL, ids)
    for bkey in keys[1:]:  # blocks 1, 2 and 3 damaged
        path = store._path("block", bkey)
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    n, _ = store.get_prefix(MODEL, ids)
    assert n == 16
    assert [store._path("block", k).exists() for k in keys] == [True, False, False, False]
    assert store.stats()["corrupt"] == 3
    store.put(MODEL, ids, layers)  # what the engine does after the miss: all three written again
    n, prefix = store.get_prefix(MODEL, ids)
    assert n == 64
    assert_same(prefix, cut(layers, 64))


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 2 MiB tmpfs (root only): a real disk that fills up."""
    with tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def test_a_full_disk_skips_writes_logs_once_and_keeps_serving(tiny_disk: Path, caplog) -> None:
    store = KVStore(tiny_disk / "kv", block_tokens=16)
    ids, layers = list(range(32)), notes(32, seed=5)
    key = store.put(MODEL, ids, layers)
    assert key is not None
    with (tiny_disk / "filler").open("wb", buffering=0) as filler:  # fill the disk to the last byte
        try:
            while filler.write(b"\0" * 4096):
                pass
        except OSError:
            pass
    with caplog.at_level(logging.WARNING):
        for seed in range(6, 12):
            big = notes(400, seed=seed)
            assert store.put(MODEL, list(range(seed * 1000, seed * 1000 + 400)), big) is None
            store.guard.breaker.reset()  # skip the cool-down: every call meets the full disk
    assert len([m for m in _warnings(caplog) if "failed" in m]) == 1
    store.guard.breaker.reset()
    assert store.get_prefix(MODEL, ids)[0] in (0, 32)  # a miss at worst (the index cannot even log a read)
    (tiny_disk / "filler").unlink()  # room again: the cache works again, no restart needed
    store.guard.breaker.reset()
    assert store.put(MODEL, list(range(7000, 7032)), notes(32, seed=13)) is not None
    n, prefix = store.get_prefix(MODEL, ids)
    assert n == 32 and prefix is not None


def test_a_run_succeeds_without_its_index(tmp_path: Path) -> None:
    """The engine prefills through the store: with the index deleted (and then damaged), notes
    still come out identical to a store-less prefill."""
    from worker.engine import load
    from worker.engine.engine import no_store

    store = KVStore(tmp_path / "kv", block_tokens=16)
    eng = load("tiny-llama", device="cpu")  # the cached engine: its store is put back after
    text = "The customer record: name Alice, age 31, status active. Only active accounts may log in. " * 3
    with no_store(eng):
        expected = eng.prefill(text)
    saved, eng.store = eng.store, store
    try:
        eng.prefill(text)
        (store.root / "index.sqlite").unlink()
        first = eng.prefill(text)
        (store.root / "index.sqlite").write_bytes(b"garbage" * 64)
        second = eng.prefill(text)
    finally:
        eng.store = saved
    for notes_ in (first, second):
        for (k, v), (ek, ev) in zip(notes_.layers, expected.layers, strict=True):
            assert torch.allclose(k, ek, atol=1e-5) and torch.allclose(v, ev, atol=1e-5)
    assert block_files(store)


def test_the_index_keeps_one_connection_with_the_databases_pragmas(tmp_path: Path) -> None:
    """data/db.py's choice (issue 49): the rollback journal and no memory mapping, so no `-shm` that
    storage could take away under a worker; one connection per process, not one per call; an
    index an older version left in WAL goes back to the rollback journal."""
    import sqlite3

    (tmp_path / "kv").mkdir()
    old = sqlite3.connect(tmp_path / "kv" / "index.sqlite")
    assert old.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    old.close()
    store = KVStore(tmp_path / "kv", block_tokens=16)
    ids = list(range(32))
    store.put(MODEL, ids, notes(32, seed=1))
    conn = store.index._conn
    assert store.get_prefix(MODEL, ids)[0] == 32 and store.stats()["hits"] == 2
    assert store.index._conn is conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert conn.execute("PRAGMA mmap_size").fetchone()[0] == 0
    assert not (tmp_path / "kv" / "index.sqlite-wal").exists()
    assert not (tmp_path / "kv" / "index.sqlite-shm").exists()
