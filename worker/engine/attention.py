"""Attention: where the decision looks — per layer and head, over every cached position.

SDPA returns no attention weights, so the capture switches the model to eager attention for this
one forward (the question suffix and the strategy's answer after its notes) and back to what it
was; the timed fast path never pays for it. The decision position is the last token of the
question suffix; every question and answer token can be a query too.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from worker.engine.notes import KV, cache_from_layers
from worker.engine.types import Attention, TokenView

if TYPE_CHECKING:
    from worker.engine.edit import Surgery


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
def capture_attention(model, layers: list[KV], ids: list[int],
                      decision: int) -> tuple[np.ndarray, np.ndarray]:
    """Attention of the tokens `ids` fed after the notes `layers` (T = cached + len(ids) tokens).

    Returns the decision position's (`ids[decision]`) attention per layer and head, float16
    [layers, heads, T] (zero past the decision), and every fed token's attention as a query,
    averaged over layers and heads, float16 [len(ids), T] (row q is zero past its own position)."""
    with eager_attention(model):
        out = model(
            input_ids=torch.tensor([ids], device=model.device),
            cache=cache_from_layers(layers),
            use_cache=True,
            output_attentions=True,
            logits_to_keep=1,
        )
    att = torch.stack([a[0].float() for a in out.attentions])  # [layers, heads, len(ids), T]
    decision_rows = att[:, :, decision, :]  # [layers, heads, T]
    per_query = att.mean(dim=(0, 1))  # [len(ids), T]
    return decision_rows.cpu().numpy().astype(np.float16), per_query.cpu().numpy().astype(np.float16)


def attention_of(model, tokenizer, surgery: Surgery, answer_ids: list[int],
                 suffix_ids: list[int]) -> Attention:
    """Where the decision looked over every token of a strategy's notes (`surgery`), and where each
    question and answer token looked, with the tokens themselves."""
    s = surgery
    answer = list(answer_ids)
    fed = list(s.pending) + list(suffix_ids) + answer
    decision = len(s.pending) + len(suffix_ids) - 1
    weights, per_query = capture_attention(model, s.layers, fed, decision)
    decode = tokenizer.decode
    views = [
        TokenView(id=tid, text=decode([tid]), start=o[0], end=o[1], segment=seg)
        for tid, o, seg in zip(s.token_ids, s.offsets, s.segments)
    ]
    views += [TokenView(id=t, text=decode([t]), start=-1, end=-1, segment="question") for t in suffix_ids]
    views += [TokenView(id=t, text=decode([t]), start=-1, end=-1, segment="answer") for t in answer]
    cached = len(s.token_ids) - len(s.pending)
    return Attention(weights=weights, tokens=views, query_weights=per_query[len(s.pending):],
                     query_start=len(s.token_ids), decision=cached + decision)
