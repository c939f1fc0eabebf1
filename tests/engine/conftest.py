"""What the engine tests share: the portable tiny families, a text and a question, keys computed
at given positions, a forward that returns logits and the K/V it leaves (split attention or
SDPA), the error measures; and for the KV store, deterministic random notes, a small-block store
and checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from worker.engine import Question
from worker.engine.notes import cache_from_layers, layers_of
from worker.engine.store import KVStore

PORTABLE = ["tiny-llama", "tiny-qwen3", "tiny-mistral", "tiny-gemma3", "tiny-phi", "tiny-llama3",
            "tiny-yarn", "tiny-moe"]
# longer than the tiny models' 16-token sliding window, so windowed layers matter
TEXT = ("Account record. status: active. owner: Ada Lovelace. region: north. "
        "Only accounts whose status is active may log in; others are refused at the door.")
QUESTION = Question("Can this user log in?", ("yes", "no"))


def keys_at(eng, ids, first_position):
    """Per-layer keys of `ids` computed directly at positions first_position.. ([1, kv, T, d])."""
    cache = DynamicCache()
    pos = torch.arange(len(ids)).unsqueeze(0) + first_position
    with torch.inference_mode():
        eng.model(input_ids=torch.tensor([ids]), position_ids=pos, cache=cache, use_cache=True)
    return [layer.keys for layer in cache.layers]


def max_rel_error(a_layers, b_layers):
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(a_layers, b_layers))


@torch.inference_mode()
def forward(model, layers, ids, mask=None, positions=None, split_cache=True):
    """Logits [L, vocab] of `ids` after `layers`, and the K/V the cache holds afterwards."""
    cache = cache_from_layers(layers, model if split_cache else None)
    out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, attention_mask=mask,
                position_ids=None if positions is None else torch.tensor([positions]))
    return out.logits[0].float(), layers_of(cache)


def max_diff(a, b):
    """Largest difference of logits and of every layer's K/V, relative to the largest value."""
    (la, kva), (lb, kvb) = a, b
    pairs = [(la, lb)] + [p for (ka, va), (kb, vb) in zip(kva, kvb) for p in ((ka, kb), (va, vb))]
    return max(float((x - y).abs().max() / y.abs().max()) for x, y in pairs)


def first_attention(model):
    """The model's first attention module."""
    return next(m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling"))


def attention_case(model, cached: int, new: int, seed: int):
    """Random queries for `new` tokens and keys / values for `cached` + `new`, at the model's scale,
    with the lower-right causal mask transformers builds after cached notes, and SDPA's output
    under it: (first attention module, q, k, v, mask, expected)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = first_attention(model)
    cfg = model.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, new, d, generator=gen) * 2
    k = torch.randn(1, kv, cached + new, d, generator=gen) * 2
    v = torch.randn(1, kv, cached + new, d, generator=gen)
    sees = torch.ones(new, cached + new, dtype=torch.bool).tril(cached)[None, None]
    expected, _ = sdpa_attention_forward(module, q, k, v, sees, scaling=module.scaling)
    return module, q, k, v, sees, expected

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
