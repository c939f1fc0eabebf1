"""Forward passes over notes: run new tokens after cached K/V, and cut or join per-layer K/V.

Notes travel as per-layer (keys, values) [1, kv_heads, T, head_dim]; `extend` feeds tokens after
them (positions continue from their length) and returns the whole, notes first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.notes import KV, cache_from_layers, layers_of
from worker.engine.split_attention import joins, splits_on_this_device

CHUNK_TOKENS = 512  # without split attention, long inputs after a cached prefix go in chunks (see `extend`)


@torch.inference_mode()
def extend(model, layers: list[KV] | None, ids: list[int]) -> list[KV]:
    """Run `ids` through the model after the cached `layers` (positions continue from their length).

    With split attention (`worker.engine.split_attention`, every engine model on the CPU) the whole
    input goes at once: the cached keys are attended without a mask and the new block causally, so
    nothing is computed twice and the notes are not copied until the end. Otherwise SDPA gets an
    explicit mask after a cached prefix and computes its masked upper half too; feeding long inputs
    in chunks keeps that waste to one chunk. The joined path (CUDA; bfloat16 and float16 anywhere)
    also takes the whole input at once: its lower-right causal bias materialises no mask, and one
    forward leaves the very bits recompute's forward does (in bf16, chunks of 512 moved keys by 0.25)."""
    if not ids:
        return layers or []
    from transformers import DynamicCache

    cache = cache_from_layers(layers, model) if layers else DynamicCache()
    step = CHUNK_TOKENS if layers and not (splits_on_this_device(model) or joins(model)) else len(ids)
    for i in range(0, len(ids), step):
        chunk = torch.tensor([ids[i:i + step]], device=model.device)
        model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
    return layers_of(cache)


@torch.inference_mode()
def fresh(model, layers: list[KV], ids: list[int]) -> list[KV]:
    """Only the K/V of `ids` run after the cached `layers` (nothing of the notes is copied)."""
    cache = cache_from_layers(layers, model)
    model(input_ids=torch.tensor([ids], device=model.device), cache=cache, use_cache=True, logits_to_keep=1)
    return [(layer.tail_keys, layer.tail_values) for layer in cache.layers]


def cut(layers: list[KV], start: int, end: int) -> list[KV]:
    return [(k[:, :, start:end], v[:, :, start:end]) for k, v in layers]


def join(a: list[KV], b: list[KV]) -> list[KV]:
    if not a:
        return b
    if not b:
        return a
    return [(torch.cat([ka, kb], 2), torch.cat([va, vb], 2)) for (ka, va), (kb, vb) in zip(a, b)]


def join_all(parts: list[list[KV]]) -> list[KV]:
    """Many runs of K/V laid end to end with ONE copy per layer (joining pairwise copies each time)."""
    parts = [p for p in parts if p and p[0][0].shape[2]]
    if len(parts) <= 1:
        return parts[0] if parts else []
    return [(torch.cat([p[i][0] for p in parts], 2), torch.cat([p[i][1] for p in parts], 2))
            for i in range(len(parts[0]))]


@dataclass(frozen=True)
class Deferred:
    """Cached positions whose K/V a strategy leaves for the readout to compute in ITS forward (the
    changed tokens of an in-place edit, CacheBlend's selected tokens): the readout's forward then
    carries them beside the question, so the strategy costs no pass of its own over the weights.
    `positions` are sorted and index the strategy's notes, which hold stale K/V or zeros there;
    `ids` are the tokens at those positions. Each deferred row attends, with its real position, to
    the notes before it that are not deferred and to the deferred rows up to itself; every row after
    them (erratum, question, choices) attends to the notes minus the deferred positions, and to every
    deferred row: exactly what it would see had the notes been completed first."""

    positions: tuple[int, ...]
    ids: tuple[int, ...]

    def __post_init__(self):
        if len(self.positions) != len(self.ids) or list(self.positions) != sorted(set(self.positions)):
            raise ValueError("deferred positions must be distinct, sorted and one per token id")


@torch.inference_mode()
def fill(layers: list[KV], deferred: Deferred, fresh: list[KV]) -> list[KV]:
    """Write `fresh` ([1, kv, n_deferred, d] per layer) into `layers` at the deferred positions, in
    place (the strategy built `layers` for itself: nothing else holds them), and return them."""
    index = torch.tensor(deferred.positions, device=layers[0][0].device)
    for (k, v), (fk, fv) in zip(layers, fresh):
        index = index.to(k.device)  # each layer's own device when the model is spread
        k.index_copy_(2, index, fk)
        v.index_copy_(2, index, fv)
    return layers


@torch.inference_mode()
def answer_nll(model, layers, prompt: list[int], answer_ids: list[int]) -> float | None:
    """Mean negative log-likelihood per token of `answer_ids` after the notes `layers` and `prompt`,
    teacher-forced in one forward (None for an empty answer). `layers` are not changed."""
    if not answer_ids:
        return None
    inputs = list(prompt) + list(answer_ids[:-1])
    out = model(input_ids=torch.tensor([inputs], device=model.device), cache=cache_from_layers(layers, model),
                use_cache=True, logits_to_keep=len(answer_ids))
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)  # [len(answer_ids), vocab]
    target = torch.tensor(answer_ids, device=logp.device)
    return float(-logp.gather(1, target[:, None]).mean())
