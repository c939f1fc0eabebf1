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

Tensors come in and go out as [kv_heads, T, head_dim] per layer (batch dimension squeezed), in the
dtype they were given (float32 on CPU, bfloat16 on GPU); they are returned on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from worker.engine.store_guard import CacheGuard, is_damaged_index, quarantine, scan_files
from worker.engine.store_index import StoreIndex

log = logging.getLogger(__name__)

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [kv_heads, T, head_dim]

@dataclass
class _File:
    """One verified file: its tensors, its metadata, its size on disk."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, str]
    size: int


@dataclass
class StoredNotes:
    """A whole sequence read back: its token ids, per-layer (keys, values) [kv_heads, T, head_dim],
    and what `put` was told about it: each token's segment ("sink", "skill", ...; empty when not
    given) and the position of its first token."""

    token_ids: list[int]
    layers: Layers
    segments: list[str]
    first_position: int


class KVStore:
    """Content-addressed, block-hashed KV notes on disk with a byte budget and LRU eviction.

    Example:
        >>> store = KVStore(Path("var/kv"), block_tokens=64)
        >>> key = store.put("smollm2-135m", ids, layers)       # layers[i] = (k, v), [kv_heads, T, head_dim]
        >>> n, prefix = store.get_prefix("smollm2-135m", ids + more_ids)   # n == 64 * (len(ids) // 64)
        >>> store.get(key)                                     # the whole sequence again, exactly
    """

    def __init__(self, root: Path, block_tokens: int = 64, budget_bytes: int = 4 * 2**30) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be at least 1, got {block_tokens}")
        self.root = Path(root)
        self.block_tokens = block_tokens
        self.budget_bytes = budget_bytes
        self.guard = CacheGuard()
        self._index: StoreIndex | None = None
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
        layers = _squeeze(layers)
        _check_shapes(layers, len(ids))
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
            tensors = _layer_tensors(layers, s, e)
            tensors["token_ids"] = torch.tensor(ids[s:e], dtype=torch.int64, device="cpu")  # for the file
            written.append((bkey, "block", self._write(path, tensors, {"model_key": model_key})))
        seq_key = _hash(b"seq", model_key.encode(), str(self.block_tokens).encode(), _ids_bytes(ids))
        tail_start = len(block_keys) * self.block_tokens
        tail = _layer_tensors(layers, tail_start, len(ids))
        tail["token_ids"] = torch.tensor(ids, dtype=torch.int64, device="cpu")
        meta = {
            "model_key": model_key,
            "blocks": json.dumps(block_keys),
            "n_layers": str(len(layers)),
            "segments": ",".join(segments),
            "first_position": str(int(first_position)),
        }
        written.append((seq_key, "seq", self._write(self._path("seq", seq_key), tail, meta)))
        self.index.record(written, touched=kept)
        self._evict()
        return seq_key

    def get_prefix(self, model_key: str, token_ids: Sequence[int]) -> tuple[int, Layers | None]:
        """The longest stored block prefix of `token_ids`: (n_tokens, layers cut to n_tokens).

        Counts one hit per block found and one miss per full block of the query not found."""
        return self._guarded("reading notes", (0, None), self._get_prefix, model_key,
                             [int(t) for t in token_ids])

    def _get_prefix(self, model_key: str, ids: list[int]) -> tuple[int, Layers | None]:
        block_keys = self._block_keys(model_key, ids)
        found: list[dict[str, torch.Tensor]] = []
        read: list[tuple[str, str, int]] = []
        for i, bkey in enumerate(block_keys):
            expect = ids[i * self.block_tokens : (i + 1) * self.block_tokens]
            loaded = self._load("block", bkey)
            if loaded is None or loaded.tensors["token_ids"].tolist() != expect:
                self._heal(block_keys[i + 1 :])
                break
            found.append(loaded.tensors)
            read.append((bkey, "block", loaded.size))
        self.index.after_read(read, hits=len(found), misses=len(block_keys) - len(found))
        if not found:
            return 0, None
        return len(found) * self.block_tokens, _concat(found)

    def get(self, key: str) -> Layers | None:
        """The whole sequence stored under `key` (as returned by `put`), or None if any part of it
        is missing, evicted or corrupt (the caller recomputes and puts it again)."""
        entry = self.get_entry(key)
        return None if entry is None else entry.layers

    def get_entry(self, key: str) -> StoredNotes | None:
        """Like `get`, with the sequence's token ids, segments and first position."""
        return self._guarded("reading notes", None, self._get_entry, key)

    def _get_entry(self, key: str) -> StoredNotes | None:
        seq = self._load("seq", key)
        if seq is None:
            self.index.after_read([], misses=1)
            return None
        tail, meta = seq.tensors, seq.meta
        parts: list[dict[str, torch.Tensor]] = []
        read = [(key, "seq", seq.size)]
        block_keys = json.loads(meta["blocks"])
        for i, bkey in enumerate(block_keys):
            block = self._load("block", bkey)
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
        return StoredNotes(token_ids, _concat(parts), segments.split(",") if segments else [],
                           int(meta.get("first_position", "0")))

    def stats(self) -> dict[str, int]:
        """Counters since the store was created: hits, misses, blocks, bytes, evictions, corrupt
        (empty when the store cannot be read)."""
        return self._guarded("reading its counters", {}, lambda: self.index.stats())

    def _heal(self, keys: list[str]) -> None:
        """After a damaged or missing block: check the rest of the chain too, so every damaged
        block met is deleted now (and written again by the caller's `put`), not one per lookup."""
        for bkey in keys:
            if self._path("block", bkey).exists():
                self._load("block", bkey)  # verifies; a damaged file is deleted and counted

    # ---- keys and paths ---------------------------------------------------------------------

    def _block_keys(self, model_key: str, ids: list[int]) -> list[str]:
        """Chained hashes: block i's key covers the model, the block size and ids[: (i+1)*B]."""
        keys: list[str] = []
        prev = _hash(b"root", model_key.encode(), str(self.block_tokens).encode())
        for i in range(len(ids) // self.block_tokens):
            chunk = ids[i * self.block_tokens : (i + 1) * self.block_tokens]
            prev = _hash(b"block", prev.encode(), _ids_bytes(chunk))
            keys.append(prev)
        return keys

    def _path(self, kind: str, key: str) -> Path:
        folder = "blocks" if kind == "block" else "seqs"
        return self.root / folder / key[:2] / f"{key}.safetensors"

    # ---- files ------------------------------------------------------------------------------

    def _write(self, path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> int:
        """Write atomically (temp file + os.replace) with a checksum; return the bytes written."""
        meta = {**meta, "sha256": _checksum(tensors)}
        data = st_save(tensors, metadata=meta)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return len(data)

    def _load(self, kind: str, key: str) -> _File | None:
        """Read and verify one file, or None when absent. A file that fails verification is
        deleted, dropped from the index and counted as corrupt. The caller records the access."""
        path = self._path(kind, key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.index.forget([key])
            return None
        try:
            meta = _header_metadata(data)
            tensors = st_load(data)
            if meta.get("sha256") != _checksum(tensors):
                raise ValueError("checksum mismatch")
        except Exception as exc:  # any parse error of a damaged file is the same event: corrupt
            log.warning("kv store: dropping a corrupt entry",
                        extra={"kind": kind, "key": key[:12], "reason": str(exc)})
            path.unlink(missing_ok=True)
            self.index.forget([key])
            self.index.count(corrupt=1)
            return None
        return _File(tensors, meta, len(data))

    def _evict(self) -> None:
        """Delete least-recently-used files until the store fits its byte budget."""
        victims = self.index.evict_to(self.budget_bytes)
        for key, kind in victims:
            self._path(kind, key).unlink(missing_ok=True)
        if victims:
            log.info("kv store: evicted files to fit",
                     extra={"files": len(victims), "budget_bytes": self.budget_bytes})


# ---- tensor helpers -----------------------------------------------------------------------------


def _hash(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def _ids_bytes(ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(ids)}q", *ids)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw bytes of any dtype (bfloat16 has no numpy twin, so view it as bytes first)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()


def _header_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file, read from its JSON header."""
    if len(data) < 8:
        raise ValueError("file shorter than its header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("truncated header")
    return json.loads(data[8 : 8 + n]).get("__metadata__", {})


def _squeeze(layers: Layers) -> Layers:
    """Accept [1, kv_heads, T, head_dim] too (a transformers cache layer) and drop the batch dim."""
    out: Layers = []
    for k, v in layers:
        if k.dim() == 4:
            if k.shape[0] != 1:
                raise ValueError(f"the KV store holds one sequence, got batch size {k.shape[0]}")
            k, v = k[0], v[0]
        out.append((k, v))
    return out


def _check_shapes(layers: Layers, n_tokens: int) -> None:
    if not layers:
        raise ValueError("no layers to store")
    for i, (k, v) in enumerate(layers):
        if k.dim() != 3 or k.shape[1] != n_tokens or v.shape[1] != n_tokens:
            raise ValueError(
                f"layer {i}: expected keys and values [kv_heads, {n_tokens}, head_dim], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )


def _layer_tensors(layers: Layers, start: int, end: int) -> dict[str, torch.Tensor]:
    """Positions [start, end) of every layer as named, contiguous CPU tensors (k.0, v.0, k.1, …)."""
    out: dict[str, torch.Tensor] = {}
    for i, (k, v) in enumerate(layers):
        out[f"k.{i}"] = k[:, start:end, :].detach().to("cpu").contiguous().clone()
        out[f"v.{i}"] = v[:, start:end, :].detach().to("cpu").contiguous().clone()
    return out


def _concat(parts: list[dict[str, torch.Tensor]]) -> Layers:
    """Join blocks along the token axis back into per-layer (keys, values)."""
    n_layers = sum(1 for name in parts[0] if name.startswith("k."))
    return [
        (
            torch.cat([p[f"k.{i}"] for p in parts], dim=1),  # [kv_heads, T, head_dim]
            torch.cat([p[f"v.{i}"] for p in parts], dim=1),
        )
        for i in range(n_layers)
    ]
