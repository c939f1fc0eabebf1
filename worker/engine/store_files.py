"""The KV store's file format and key helpers: chained SHA-256 keys over token ids, safetensors bytes
with a checksum of their tensors, and the layer slicing and joining around them (worker.engine.store).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from vocabulary.prefix import hash_parts, ids_bytes, next_block

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [kv_heads, T, head_dim]


# what a file must hold under its key, beyond its checksum: "" when it does, else what is wrong
Claims = Callable[[dict[str, torch.Tensor], dict[str, str]], str]


def any_claims(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    return ""


def block_claims(model_key: str, expect: list[int]) -> Claims:
    """A block holds the token ids its key was derived from (with every earlier block's: the chain)
    and was written for this model key, so an object another model wrote, or one copied under
    another block's name, is a miss."""
    def check(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
        if meta.get("model_key") != model_key:
            return "written for another model key"
        if tensors["token_ids"].tolist() != expect:
            return "token ids other than its key's"
        return ""
    return check


def seq_claims(key: str, block_tokens: int) -> Claims:
    """A manifest is what its key says: the key derived again from the model key and the token
    ids it claims, and its block list derived again from them, so a manifest written (with a
    valid checksum) under another sequence's key is a miss, never another sequence's notes."""
    def check(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
        ids = tensors["token_ids"].tolist()
        model_key = meta.get("model_key", "")
        if seq_key(model_key, block_tokens, ids) != key:
            return "its key is not the hash of the model key and token ids it claims"
        if json.loads(meta.get("blocks", "null")) != block_keys(model_key, block_tokens, ids):
            return "its block list is not the one its token ids give"
        return ""
    return check


def seq_key(model_key: str, block_tokens: int, ids: list[int]) -> str:
    """A whole sequence's key: the model key, the block size and every token id."""
    return hash_parts(b"seq", model_key.encode(), str(block_tokens).encode(), ids_bytes(ids))


def block_keys(model_key: str, block_tokens: int, ids: list[int]) -> list[str]:
    """Chained hashes: block i's key covers the model, the block size and ids[: (i+1)*B]."""
    keys: list[str] = []
    prev = hash_parts(b"root", model_key.encode(), str(block_tokens).encode())
    for i in range(len(ids) // block_tokens):
        chunk = ids[i * block_tokens : (i + 1) * block_tokens]
        prev = next_block(prev, chunk)
        keys.append(prev)
    return keys


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw bytes of any dtype (bfloat16 has no numpy twin, so view it as bytes first)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def checksum(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """SHA-256 over every tensor (name, dtype, shape, bytes) and every metadata entry but the
    checksum itself: a manifest's `blocks`, `first_position`, `segments` and `model_key` are covered."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(tensor_bytes(t))
    h.update(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode())
    return h.hexdigest()


def header_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file, read from its JSON header."""
    if len(data) < 8:
        raise ValueError("file shorter than its header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("truncated header")
    return json.loads(data[8 : 8 + n]).get("__metadata__", {})


def squeeze(layers: Layers) -> Layers:
    """Accept [1, kv_heads, T, head_dim] too (a transformers cache layer) and drop the batch dim."""
    out: Layers = []
    for k, v in layers:
        if k.dim() == 4:
            if k.shape[0] != 1:
                raise ValueError(f"the KV store holds one sequence, got batch size {k.shape[0]}")
            k, v = k[0], v[0]
        out.append((k, v))
    return out


def check_shapes(layers: Layers, n_tokens: int) -> None:
    if not layers:
        raise ValueError("no layers to store")
    for i, (k, v) in enumerate(layers):
        if k.dim() != 3 or k.shape[1] != n_tokens or v.shape[1] != n_tokens:
            raise ValueError(
                f"layer {i}: expected keys and values [kv_heads, {n_tokens}, head_dim], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )


def layer_tensors(layers: Layers, start: int, end: int) -> dict[str, torch.Tensor]:
    """Positions [start, end) of every layer as named, contiguous CPU tensors (k.0, v.0, k.1, …)."""
    out: dict[str, torch.Tensor] = {}
    for i, (k, v) in enumerate(layers):
        out[f"k.{i}"] = k[:, start:end, :].detach().to("cpu").contiguous().clone()
        out[f"v.{i}"] = v[:, start:end, :].detach().to("cpu").contiguous().clone()
    return out


def concat(parts: list[dict[str, torch.Tensor]]) -> Layers:
    """Join blocks along the token axis back into per-layer (keys, values)."""
    n_layers = sum(1 for name in parts[0] if name.startswith("k."))
    return [
        (
            torch.cat([p[f"k.{i}"] for p in parts], dim=1),  # [kv_heads, T, head_dim]
            torch.cat([p[f"v.{i}"] for p in parts], dim=1),
        )
        for i in range(n_layers)
    ]


def verified(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a file's bytes; ValueError (or a parse error) when the bytes are
    damaged: a bad header, truncated tensors, or a checksum that does not match."""
    meta = header_metadata(data)
    tensors = st_load(data)
    if meta.get("sha256") != checksum(tensors, meta):
        raise ValueError("checksum mismatch")
    return tensors, meta


def file_bytes(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bytes:
    """A file's bytes: the tensors as safetensors, the checksum of them and of `meta` in the metadata."""
    return st_save(tensors, metadata={**meta, "sha256": checksum(tensors, meta)})


@dataclass
class StoredFile:
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


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file and `os.replace`: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
