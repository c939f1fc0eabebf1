"""Attention: where the decision looks — per layer and head, over every cached position.

SDPA returns no attention weights, so the capture switches the model to eager attention for this
one forward (the question suffix after a strategy's notes) and back to what it was; the timed fast
path never pays for it. The decision position is the last token of the question suffix.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from worker.engine.notes import KV, cache_from_layers


@contextlib.contextmanager
def eager_attention(model):
    previous = model.config._attn_implementation
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        if previous != "eager":
            model.set_attn_implementation(previous)


@torch.inference_mode()
def capture_attention(model, layers: list[KV], suffix_ids: list[int]) -> np.ndarray:
    """Attention of the last suffix token after the notes `layers`: float16 [layers, heads, T],
    T = cached tokens + suffix tokens."""
    with eager_attention(model):
        out = model(
            input_ids=torch.tensor([suffix_ids], device=model.device),
            cache=cache_from_layers(layers),
            use_cache=True,
            output_attentions=True,
            logits_to_keep=1,
        )
    rows = [a[0, :, -1, :].float() for a in out.attentions]  # each [heads, T]
    return torch.stack(rows).cpu().numpy().astype(np.float16)
