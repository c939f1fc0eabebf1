"""The KV store: notes (per-layer keys and values) on disk, content addressed and block hashed.

A sequence's notes are cut into fixed-size token blocks, the way a serving engine's prefix cache
(vLLM's block pool) does it. A block's key hashes (model key, block size, EVERY token id up to the
block's end), so two documents that share a prefix share those blocks, and a lookup walks the chain
until the first block it does not have. Only full blocks are stored as blocks; `put` also writes a
small manifest for the whole sequence (its block keys plus the partial tail) so a compiled skill can
be fetched back exactly by the key `put` returned.

Files are safetensors under `<root>/blocks/ab/<key>.safetensors` and `<root>/seqs/ab/<key>...`.
Every file carries a sha256 of its tensor bytes in its metadata, checked on every load: a corrupted
or truncated file is deleted, counted (`corrupt`) and treated as a miss, never returned. An sqlite
index (`<root>/index.sqlite`, `worker.engine.store_index`) holds sizes, a least-recently-used clock
and the hit/miss counters; it is shared safely between processes. Writes go through a
temporary file and `os.replace`, so a reader never sees half a file from a writer that is still
running (a writer killed mid-write leaves only a stray `.tmp`).

The store is a cache (`worker.engine.store_guard`): every public method turns an I/O failure
(damaged or deleted index, full disk, permissions) into a miss or a skipped write, logged once;
a damaged index is quarantined and rebuilt from the files; every damaged block a lookup meets is
deleted (so the caller's `put` writes it again), not only the first.

With a `SharedConfig` (KVNOTES_STORE_URL=s3://BUCKET/PREFIX; issue 40) the folder is the near tier
of two: a file absent here is read from the shared tier (`worker.engine.store_tiers`, S3-compatible
storage), verified and kept here; every file written here is queued for the shared tier and written
in the background. `last_reuse` says how many tokens a lookup read and from which tier, and what a
fault of the shared tier (unreachable, missing bucket, damaged object: each a miss) cost it.

Tensors come in and go out as [kv_heads, T, head_dim] per layer (batch dimension squeezed), in the
dtype they were given (float32 on CPU, bfloat16 on GPU); they are returned on the CPU.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import torch

from worker.engine.store_files import (
    Claims,
    Layers,
    StoredFile,
    StoredNotes,
    any_claims,
    block_claims,
    block_keys,
    check_shapes,
    concat,
    file_bytes,
    layer_tensors,
    seq_claims,
    seq_key,
    squeeze,
    verified,
    write_atomic,
)
from worker.engine.store_guard import CacheGuard, is_damaged_index, quarantine, scan_files
from worker.engine.store_index import StoreIndex
from worker.engine.store_s3 import SharedConfig
from worker.engine.store_tiers import Reuse, Shared

log = logging.getLogger(__name__)

class KVStore:
    """Content-addressed, block-hashed KV notes on disk with a byte budget and LRU eviction.

    Example:
        >>> store = KVStore(Path("var/kv"), block_tokens=64)
        >>> key = store.put("smollm2-135m", ids, layers)       # layers[i] = (k, v), [kv_heads, T, head_dim]
        >>> n, prefix = store.get_prefix("smollm2-135m", ids + more_ids)   # n == 64 * (len(ids) // 64)
        >>> store.get(key)                                     # the whole sequence again, exactly
    """

    def __init__(self, root: Path, block_tokens: int = 64, budget_bytes: int = 4 * 2**30,
                 shared: SharedConfig | None = None) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be at least 1, got {block_tokens}")
        self.root = Path(root)
        self.block_tokens = block_tokens
        self.budget_bytes = budget_bytes
        self.guard = CacheGuard()
        self._index: StoreIndex | None = None
        # the shared tier behind the local folder (issue 40), and what the last lookup found
        self.shared = Shared(shared) if shared is not None else None
        self.last_reuse = Reuse()
        self._reuse = Reuse()
        self._prefetched: dict[str, bytes] = {}  # what the shared tier sent for the lookup under way
        self._guarded("open", None, self._open)

    @property
    def index(self) -> StoreIndex:
        if self._index is None:
            self._open()
        assert self._index is not None
        return self._index

    def _open(self) -> None:
        (self.root / "blocks").mkdir(parents=True, exist_ok=True)
        (self.root / "seqs").mkdir(parents=True, exist_ok=True)
        self._index = StoreIndex(self.root / "index.sqlite")

    def _guarded(self, what: str, default, action, *args, **kwargs):
        """`action(*args)`, or `default` when the store fails (logged once; a damaged index is
        quarantined and rebuilt). Programming errors (bad shapes) still raise."""
        if not self.guard.available():
            return default
        try:
            result = action(*args, **kwargs)
        except (OSError, sqlite3.Error) as exc:
            if is_damaged_index(exc):
                self._rebuild_index(exc)
            else:
                self.guard.fault(what, exc)
            return default
        self.guard.ok()
        return result

    def _rebuild_index(self, exc: BaseException) -> None:
        """Quarantine the damaged index and build a new one from the files on disk."""
        self.guard.fault("index", exc, cooldown=False)
        try:
            if self._index is not None:
                self._index.close()
            self._index = None
            quarantine(self.root / "index.sqlite")
            self._open()
            entries = scan_files(self.root)
            self.index.record(entries)
            log.warning("kv store: index rebuilt from the files", extra={"files": len(entries)})
        except (OSError, sqlite3.Error) as again:
            self._index = None
            self.guard.fault("rebuilding the index", again)

    # ---- public API -------------------------------------------------------------------------

    def put(
        self, model_key: str, token_ids: Sequence[int], layers: Layers,
        segments: Sequence[str] = (), first_position: int = 0,
    ) -> str | None:
        """Store the notes of `token_ids`; return the key of the whole sequence (for `get`), or
        None when the store could not keep them (full disk, permissions: logged once).

        Full blocks already present are only touched (LRU), not rewritten. `segments` (one word per
        token) and `first_position` are kept with the sequence and returned by `get_entry`."""
        ids = [int(t) for t in token_ids]
        layers = squeeze(layers)
        check_shapes(layers, len(ids))
        if segments and (len(segments) != len(ids) or any("," in s for s in segments)):
            raise ValueError(f"segments: one comma-free word per token ({len(ids)}), got {len(segments)}")
        return self._guarded("writing notes", None, self._put, model_key, ids, layers, segments,
                             first_position)

    def _put(self, model_key: str, ids: list[int], layers: Layers, segments: Sequence[str],
             first_position: int) -> str:
        block_keys = self._block_keys(model_key, ids)
        known = self.index.known(block_keys)
        written: list[tuple[str, str, int]] = []
        kept: list[str] = []
        for i, bkey in enumerate(block_keys):
            path = self._path("block", bkey)
            if bkey in known and path.exists():
                kept.append(bkey)
                continue
            s, e = i * self.block_tokens, (i + 1) * self.block_tokens
            tensors = layer_tensors(layers, s, e)
            tensors["token_ids"] = torch.tensor(ids[s:e], dtype=torch.int64, device="cpu")  # for the file
            written.append((bkey, "block", self._write("block", bkey, tensors, {"model_key": model_key})))
        seq_key = self._seq_key(model_key, ids)
        tail_start = len(block_keys) * self.block_tokens
        tail = layer_tensors(layers, tail_start, len(ids))
        tail["token_ids"] = torch.tensor(ids, dtype=torch.int64, device="cpu")
        meta = {
            "model_key": model_key,
            "blocks": json.dumps(block_keys),
            "n_layers": str(len(layers)),
            "segments": ",".join(segments),
            "first_position": str(int(first_position)),
        }
        written.append((seq_key, "seq", self._write("seq", seq_key, tail, meta)))
        self.index.record(written, touched=kept)
        if self.shared is not None:  # kept blocks the shared index lost are uploaded again (healing)
            self.shared.offer("block", [(k, self._path("block", k)) for k in kept])
        self._evict()
        return seq_key

    def get_prefix(self, model_key: str, token_ids: Sequence[int]) -> tuple[int, Layers | None]:
        """The longest stored block prefix of `token_ids`: (n_tokens, layers cut to n_tokens).

        Counts one hit per block found and one miss per full block of the query not found.
        `last_reuse` says how many tokens came from which tier and what the shared tier did."""
        self._reuse = Reuse()
        found = self._guarded("reading notes", (0, None), self._get_prefix, model_key,
                              [int(t) for t in token_ids])
        self._reuse.tokens = found[0]
        if found[0] and not self._reuse.tier:
            self._reuse.tier = "local"
        self.last_reuse = self._reuse
        return found

    def _get_prefix(self, model_key: str, ids: list[int]) -> tuple[int, Layers | None]:
        block_keys = self._block_keys(model_key, ids)
        self._prefetch("block", block_keys)
        found: list[dict[str, torch.Tensor]] = []
        read: list[tuple[str, str, int]] = []
        for i, bkey in enumerate(block_keys):
            expect = ids[i * self.block_tokens : (i + 1) * self.block_tokens]
            loaded = self._load("block", bkey, block_claims(model_key, expect))
            if loaded is None:
                self._heal(block_keys[i + 1 :])
                break
            found.append(loaded.tensors)
            read.append((bkey, "block", loaded.size))
        self._prefetched = {}
        self.index.after_read(read, hits=len(found), misses=len(block_keys) - len(found))
        if not found:
            return 0, None
        return len(found) * self.block_tokens, concat(found)

    def get(self, key: str) -> Layers | None:
        """The whole sequence stored under `key` (as returned by `put`), or None if any part of it
        is missing, evicted or corrupt (the caller recomputes and puts it again)."""
        entry = self.get_entry(key)
        return None if entry is None else entry.layers

    def get_entry(self, key: str) -> StoredNotes | None:
        """Like `get`, with the sequence's token ids, segments and first position."""
        self._reuse = Reuse()
        entry = self._guarded("reading notes", None, self._get_entry, key)
        if entry is not None:
            self._reuse.tokens = len(entry.token_ids)
            self._reuse.tier = self._reuse.tier or "local"
        self.last_reuse = self._reuse
        return entry

    def _get_entry(self, key: str) -> StoredNotes | None:
        try:
            return self._get_entry_parts(key)
        finally:
            self._prefetched = {}

    def _get_entry_parts(self, key: str) -> StoredNotes | None:
        self._prefetch("seq", [key])
        seq = self._load("seq", key, seq_claims(key, self.block_tokens))
        if seq is None:
            self.index.after_read([], misses=1)
            return None
        tail, meta = seq.tensors, seq.meta
        parts: list[dict[str, torch.Tensor]] = []
        read = [(key, "seq", seq.size)]
        block_keys = json.loads(meta["blocks"])
        ids = tail["token_ids"].tolist()
        B = self.block_tokens
        self._prefetch("block", block_keys)
        for i, bkey in enumerate(block_keys):
            block = self._load("block", bkey, block_claims(meta["model_key"], ids[i * B : (i + 1) * B]))
            if block is None:
                self._heal(block_keys[i + 1 :])
                self.index.after_read(read, misses=1)
                return None
            parts.append(block.tensors)
            read.append((bkey, "block", block.size))
        self.index.after_read(read, hits=1)
        token_ids = tail.pop("token_ids").tolist()
        parts.append(tail)
        segments = meta.get("segments", "")
        return StoredNotes(token_ids, concat(parts), segments.split(",") if segments else [],
                           int(meta.get("first_position", "0")))

    def stats(self) -> dict[str, int]:
        """Counters since the store was created: hits, misses, blocks, bytes, evictions, corrupt
        (empty when the store cannot be read)."""
        return self._guarded("reading its counters", {}, lambda: self.index.stats())

    def shared_stats(self) -> dict[str, int | str]:
        """The shared tier's size, budget and counters (all workers' from its index, this process's
        own as process_*), or {} when there is no shared tier."""
        return self.shared.stats() if self.shared is not None else {}

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait for the shared tier's background jobs (tests, stats); False on timeout."""
        return self.shared.tier.flush(timeout_s) if self.shared is not None else True

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> str:
        """Stop the shared tier's writer, draining its queue first (up to `timeout_s`) or abandoning
        it, and close the index; returns which ("drained", "abandoned N uploads (B bytes)")."""
        said = self.shared.close(drain, timeout_s) if self.shared is not None else "drained"
        if self._index is not None:
            self._index.close()
        return said

    def _prefetch(self, kind: str, keys: list[str]) -> None:
        """Before a lookup walks `keys`: the chain of those absent here, read from the shared tier at
        once (parallel HEADs and GETs, `Shared.lookup`), for `_load_shared` to verify and keep."""
        self._prefetched = {}
        if self.shared is None:
            return
        absent = [k for k in keys if not self._path(kind, k).exists()]
        if absent:
            self._prefetched = self.shared.lookup(kind, absent, self._reuse)

    def _heal(self, keys: list[str]) -> None:
        """After a damaged or missing block: check the rest of the chain too, so every damaged
        block met is deleted now (and written again by the caller's `put`), not one per lookup:
        local files and what the shared tier sent alike."""
        for bkey in keys:
            if self._path("block", bkey).exists():
                self._load("block", bkey, any_claims)  # verifies; a damaged file is deleted and counted
            elif bkey in self._prefetched:
                self._load_shared("block", bkey, any_claims)  # kept when sound, else deleted there

    # ---- keys and paths ---------------------------------------------------------------------

    def _seq_key(self, model_key: str, ids: list[int]) -> str:
        return seq_key(model_key, self.block_tokens, ids)

    def _block_keys(self, model_key: str, ids: list[int]) -> list[str]:
        return block_keys(model_key, self.block_tokens, ids)

    def _path(self, kind: str, key: str) -> Path:
        folder = "blocks" if kind == "block" else "seqs"
        return self.root / folder / key[:2] / f"{key}.safetensors"

    # ---- files ------------------------------------------------------------------------------

    def _write(self, kind: str, key: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> int:
        """Write atomically (temp file + os.replace) with a checksum, then queue the same bytes for the
        shared tier (never waited for); return the bytes written."""
        data = file_bytes(tensors, meta)
        write_atomic(self._path(kind, key), data)
        if self.shared is not None:
            self.shared.publish(kind, key, data)
        return len(data)

    def _load(self, kind: str, key: str, claims: Claims) -> StoredFile | None:
        """Read and verify one file, or None when absent. A file that fails verification, or whose
        contents are not what `claims` expects under its key, is deleted, dropped from the index and
        counted as corrupt. A file absent here is looked up in the shared tier and, when it
        verifies, kept here (a damaged shared object is deleted there). The caller records the
        access."""
        path = self._path(kind, key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.index.forget([key])
            return self._load_shared(kind, key, claims)
        try:
            tensors, meta = verified(data)
            wrong = claims(tensors, meta)
            if wrong:
                raise ValueError(wrong)
        except Exception as exc:  # any parse error of a damaged file is the same event: corrupt
            log.warning("kv store: dropping a corrupt entry",
                        extra={"kind": kind, "key": key[:12], "reason": str(exc)})
            path.unlink(missing_ok=True)
            self.index.forget([key])
            self.index.count(corrupt=1)
            return None
        return StoredFile(tensors, meta, len(data))

    def _load_shared(self, kind: str, key: str, claims: Claims) -> StoredFile | None:
        if self.shared is None:
            return None
        data = self._prefetched.pop(key, None)
        if data is None:
            return None
        try:
            tensors, meta = verified(data)
            wrong = claims(tensors, meta)
            if wrong:
                raise ValueError(wrong)
        except Exception:  # damaged, truncated or not what its key says in the shared tier: a miss,
            # and deleted there
            self.shared.drop_damaged(kind, key, self._reuse)
            return None
        write_atomic(self._path(kind, key), data)  # kept locally; the caller indexes it
        self._reuse.tier = "shared"
        return StoredFile(tensors, meta, len(data))

    def _evict(self) -> None:
        """Delete least-recently-used files until the store fits its byte budget."""
        victims = self.index.evict_to(self.budget_bytes)
        for key, kind in victims:
            self._path(kind, key).unlink(missing_ok=True)
        if victims:
            log.info("kv store: evicted files to fit",
                     extra={"files": len(victims), "budget_bytes": self.budget_bytes})
