"""Selective recompute, CacheBlend's rule: rank reused tokens by how far their first-layer K/V move
when the first layer is re-run with the real context, then recompute only the top fraction.

Ranking is cheap by construction: decoder layer 0 is re-run over the candidate tokens after the
exact prefix, and the forward stops as soon as layer 1 has computed its keys and values (before its
attention and MLP); the deviation of each token's layer-1 K/V from the reused ones is its score.
Never a full recompute to find the tokens.

The chosen tokens are then recomputed in ONE forward (`recompute_in_one_pass`): each sees, layer by
layer, the reused K/V of unselected tokens before it and the fresh K/V of selected tokens before it
(a custom mask over the cache + the new block, real positions); the fresh K/V are written over the
stale ones. A model with sliding-window layers whose decoder takes a mask per layer type (Gemma 2/3)
gets two masks in that forward, the sliding layers' one cut to the window; other sliding-window
models recompute run by run (one forward per run: on gemma3-270m, 29 runs for 170 of 1,129 tokens
took 67.7 s against recompute's 22.7 s, 97% of selective's time, where the one pass took 16.3 s).
The edit and compose strategies skip even that forward where they can: the chosen tokens go through
the readout's forward beside the question (`worker.engine.forward.Deferred`, the same mask).
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from worker.engine.forward import cut, extend, join, join_all
from worker.engine.notes import KV, cache_from_layers
from worker.engine.split_attention import NotesLayer, forget_pending

# layer 0 is re-run; tokens are ranked by the K/V of layer 1 (CacheBlend's "first layer")
SELECTION_LAYERS = 2
GAP_MERGE = 4  # run by run: selected tokens this close together are recomputed as one run


def has_sliding_window(model) -> bool:
    """Whether some layer attends through a sliding window (a custom 4D mask would override it)."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None) or []
    return bool(getattr(config, "sliding_window", None)) and (not types or "sliding_attention" in types)


def top_fraction(scores: torch.Tensor, candidates: list[int], start: int, fraction: float) -> list[int]:
    """The ceil(fraction · n) candidates with the highest score (scores[j - start]), in order."""
    k = min(len(candidates), math.ceil(fraction * len(candidates)))
    return sorted(sorted(candidates, key=lambda j: float(scores[j - start]), reverse=True)[:k])


class _StopForward(Exception):
    pass


class _StopAfterUpdate(NotesLayer):
    """The cache layer of the ranking layer: it keeps the fresh K/V, then ends the forward."""

    def update(self, key_states, value_states, *args, **kwargs):
        super().update(key_states, value_states, *args, **kwargs)
        forget_pending()
        raise _StopForward


@torch.inference_mode()
def movement(model, layers: list[KV], ids: list[int], start: int) -> torch.Tensor:
    """How far each token's layer-(SELECTION_LAYERS-1) K/V move when tokens `ids[start:]` are run
    again after the notes `layers[:start]`: [T - start] (summed L2 norms over heads)."""
    stop_at = min(SELECTION_LAYERS, len(layers)) - 1
    cache = cache_from_layers(cut(layers, 0, start), model)
    keys, values = cache.layers[stop_at].notes_keys, cache.layers[stop_at].notes_values
    cache.layers[stop_at] = _StopAfterUpdate(keys, values, cache.layers[stop_at].config, index=stop_at)
    try:
        model(input_ids=torch.tensor([ids[start:]], device=model.device), cache=cache, use_cache=True,
              logits_to_keep=1)
    except _StopForward:
        pass
    return _moved(layers, [(layer.tail_keys, layer.tail_values) for layer in cache.layers], start, 0)


def movement_of(layers: list[KV], exact: list[KV], start: int) -> torch.Tensor:
    """`movement`, read off notes `exact` whose tokens from `start` on were computed after
    `layers[:start]` in one forward (the reference from the first change on, `Editor.exact_from`):
    that forward's layer-(SELECTION_LAYERS-1) K/V are the ones `movement` computes, so no forward."""
    return _moved(layers, exact, start, start)


def _moved(layers: list[KV], fresh: list[KV], start: int, at: int) -> torch.Tensor:
    """[T - start]: per token from `start` on, how far `fresh` (its tokens from `at` on) moved from
    `layers` at the ranking layer (summed L2 norms of K and V over heads)."""
    stop_at = min(SELECTION_LAYERS, len(layers)) - 1
    k_new, v_new = (t[:, :, at:].float() for t in fresh[stop_at])  # [1, kv, T - start, d]
    k_old, v_old = (t[:, :, start:].float() for t in layers[stop_at])
    return ((k_new - k_old).norm(dim=-1) + (v_new - v_old).norm(dim=-1)).sum(dim=1)[0]


def takes_mask_per_layer_type(model) -> bool:
    """Whether the model's decoder takes `attention_mask` as a {layer type: mask} mapping (Gemma 2/3
    and the other models whose forward accepts a prepared mapping), so one forward can carry a
    sliding-window mask and a full one."""
    return _takes_mask_mapping(type(model.get_decoder()))


@functools.cache
def _takes_mask_mapping(decoder_class) -> bool:
    try:
        source = inspect.getsource(decoder_class.forward)
    except (OSError, TypeError):
        return False
    return "isinstance(causal_mask_mapping := attention_mask, dict)" in source


def recompute_selected(model, layers: list[KV], ids: list[int], selected: list[int]) -> list[KV]:
    """`layers` (the notes of `ids`) with the K/V of the `selected` positions (sorted) recomputed."""
    if not selected:
        return layers
    if has_sliding_window(model) and not takes_mask_per_layer_type(model):
        return recompute_in_runs(model, layers, ids, selected)
    return recompute_in_one_pass(model, layers, ids, selected)


def recompute_in_runs(model, layers: list[KV], ids: list[int], selected: list[int]) -> list[KV]:
    """Selected tokens recomputed run by run, in order; runs closer than GAP_MERGE are merged."""
    out = cut(layers, 0, selected[0])
    pos = selected[0]
    for r1, r2 in runs(selected, GAP_MERGE):
        out = join(out, cut(layers, pos, r1))
        out = extend(model, out, ids[r1:r2])
        pos = r2
    return join_all([out, cut(layers, pos, len(ids))])


@torch.inference_mode()
def recompute_in_one_pass(model, layers: list[KV], ids: list[int], selected: list[int]) -> list[KV]:
    """Every selected token recomputed in ONE forward (see the module doc)."""
    total, device = len(ids), model.device
    sel = torch.tensor(selected, device=device)
    is_sel = torch.zeros(total, dtype=torch.bool, device=device)
    is_sel[sel] = True
    sees_cache = (torch.arange(total, device=device)[None, :] < sel[:, None]) & ~is_sel[None, :]
    sees_new = sel[None, :] <= sel[:, None]
    mask = torch.cat([sees_cache, sees_new], dim=1)[None, None]
    if has_sliding_window(model):  # one mask per layer type: the window cuts the sliding layers' mask
        window = model.config.get_text_config(decoder=True).sliding_window
        key_pos = torch.cat([torch.arange(total, device=device), sel])
        in_window = key_pos[None, :] > sel[:, None] - window  # transformers' sliding_window_overlay
        mask = {"full_attention": mask, "sliding_attention": mask & in_window[None, None]}
    cache = cache_from_layers(layers, model)
    model(input_ids=torch.tensor([[ids[j] for j in selected]], device=device),
          position_ids=sel[None], attention_mask=mask, cache=cache, use_cache=True,
          logits_to_keep=1)
    out = []
    for (k, v), layer in zip(layers, cache.layers):
        index = sel.to(k.device)  # a model spread over devices keeps each layer's notes on its own
        out.append((k.index_copy(2, index, layer.tail_keys), v.index_copy(2, index, layer.tail_values)))
    return out


def runs(sorted_positions: list[int], gap: int) -> list[tuple[int, int]]:
    """Consecutive runs [start, end) of positions, merging runs separated by fewer than `gap`."""
    found: list[list[int]] = []
    for j in sorted_positions:
        if found and j - found[-1][1] < gap:
            found[-1][1] = j + 1
        else:
            found.append([j, j + 1])
    return [(a, b) for a, b in found]
