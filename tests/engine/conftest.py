"""What the KV-store tests share: deterministic random notes, a small-block store, and checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.engine.store import KVStore

N_LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 8
MODEL = "tiny-llama"


def notes(
    n_tokens: int, seed: int, dtype: torch.dtype = torch.float32
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random per-layer K/V, [kv_heads, T, head_dim], deterministic by seed."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(KV_HEADS, n_tokens, HEAD_DIM, generator=g).to(dtype),
            torch.randn(KV_HEADS, n_tokens, HEAD_DIM, generator=g).to(dtype),
        )
        for _ in range(N_LAYERS)
    ]


def cut(layers, n: int):
    return [(k[:, :n], v[:, :n]) for k, v in layers]


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for (ka, va), (kb, vb) in zip(a, b, strict=True):
        assert ka.dtype == kb.dtype and ka.shape == kb.shape
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.fixture
def store(tmp_path: Path) -> KVStore:
    return KVStore(tmp_path / "kv", block_tokens=16)


def block_files(store: KVStore) -> list[Path]:
    return sorted((store.root / "blocks").rglob("*.safetensors"))
