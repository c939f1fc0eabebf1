"""Edit: changing fields of a document whose notes are already cached — every strategy of the paper.

The old notes hold the tokens of the old text; the new text tokenizes to `new_ids`. A token-level
diff (difflib, no junk heuristic) splits the new sequence into blocks equal to old tokens and
changed blocks (the fields, plus any token whose boundaries moved). Each strategy decides what to
recompute:

| strategy        | recomputed                                                     |
| recompute       | every token (the oracle)                                       |
| prefix_reuse    | every token from the first change on (exact, a serving engine's prefix cache) |
| stale           | nothing                                                        |
| in_place        | the changed blocks; equal blocks keep their old K/V, keys re-rotated by the length change Δ |
| erratum         | an appended correction only                                    |
| field_erratum   | in_place + the appended correction                             |
| selective       | in_place + the top fraction of downstream tokens whose notes moved most (CacheBlend-like) |

`selective` ranks downstream tokens cheaply: it re-runs only the first two decoder layers over the
tokens after the first change, measures how far each reused token's layer-2 K/V moved, and then
recomputes the top fraction in ALL layers — never a full recompute to find them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import torch

from worker.engine.notes import KV, Notes, cache_from_layers, layers_of
from worker.engine.rope import RopeLayout, shift_keys
from worker.engine.split_attention import splits_on_this_device

CHUNK_TOKENS = 512  # without split attention, long inputs after a cached prefix go in chunks (see `extend`)
SELECTION_LAYERS = 2  # decoder layers re-run to rank downstream tokens in `selective`
GAP_MERGE = 4  # selected tokens this close together are recomputed as one run


@dataclass
class Surgery:
    """A strategy's cache: per-layer K/V for `token_ids` minus the trailing `pending` tokens, which
    the strategy appends and the readout computes in the same forward as the question (an erratum).
    `tokens_computed` counts every token the strategy runs through the model, pending ones included."""

    layers: list[KV]
    token_ids: list[int]
    segments: list[str]
    offsets: list[tuple[int, int]]
    tokens_computed: int
    detail: str = ""
    pending: list[int] = field(default_factory=list)


@torch.inference_mode()
def extend(model, layers: list[KV] | None, ids: list[int]) -> list[KV]:
    """Run `ids` through the model after the cached `layers` (positions continue from their length).

    With split attention (`worker.engine.split_attention`, every engine model on the CPU) the whole
    input goes at once: the cached keys are attended without a mask and the new block causally, so
    nothing is computed twice and the notes are not copied until the end. Otherwise SDPA gets an
    explicit mask after a cached prefix and computes its masked upper half too; feeding long inputs
    in chunks keeps that waste to one chunk."""
    if not ids:
        return layers or []
    from transformers import DynamicCache

    cache = cache_from_layers(layers, model) if layers else DynamicCache()
    step = CHUNK_TOKENS if layers and not splits_on_this_device(model) else len(ids)
    for i in range(0, len(ids), step):
        chunk = torch.tensor([ids[i:i + step]], device=model.device)
        model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
    return layers_of(cache)


def cut(layers: list[KV], start: int, end: int) -> list[KV]:
    return [(k[:, :, start:end], v[:, :, start:end]) for k, v in layers]


def join(a: list[KV], b: list[KV]) -> list[KV]:
    if not a:
        return b
    if not b:
        return a
    return [(torch.cat([ka, kb], 2), torch.cat([va, vb], 2)) for (ka, va), (kb, vb) in zip(a, b)]


def shift(layers: list[KV], rope: RopeLayout | None, delta: int) -> list[KV]:
    if delta == 0:
        return layers
    if rope is None:
        from worker.engine.rope import NotPortableError

        raise NotPortableError("this model's keys cannot be re-rotated, so an edit may not change the length")
    return [(shift_keys(k, rope.layers[i], delta), v) for i, (k, v) in enumerate(layers)]


@dataclass(frozen=True)
class Block:
    """A run of new tokens [j1, j2): `reuse` = equal to old tokens [i1, i1 + j2 - j1)."""

    j1: int
    j2: int
    reuse: bool
    i1: int = -1


def diff_blocks(old_ids: list[int], new_ids: list[int]) -> list[Block]:
    matcher = SequenceMatcher(a=old_ids, b=new_ids, autojunk=False)
    blocks = []
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if j2 == j1:
            continue  # pure deletion: nothing of it survives in the new sequence
        blocks.append(Block(j1, j2, tag == "equal", i1 if tag == "equal" else -1))
    return blocks


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Editor:
    """Applies strategies to one (old notes → new tokens) change."""

    def __init__(self, model, rope: RopeLayout | None, old: Notes, new_ids: list[int],
                 new_segments: list[str], new_offsets: list[tuple[int, int]]):
        self.model, self.rope, self.old = model, rope, old
        self.new_ids, self.new_segments, self.new_offsets = new_ids, new_segments, new_offsets
        self.blocks = diff_blocks(old.token_ids, new_ids)

    def _surgery(self, layers: list[KV], computed: int, detail: str = "") -> Surgery:
        return Surgery(layers, list(self.new_ids), list(self.new_segments), list(self.new_offsets), computed, detail)

    def recompute(self) -> Surgery:
        return self._surgery(extend(self.model, None, self.new_ids), len(self.new_ids))

    def prefix_reuse(self) -> Surgery:
        p = min(common_prefix(self.old.token_ids, self.new_ids), len(self.new_ids))
        layers = extend(self.model, cut(self.old.layers, 0, p), self.new_ids[p:])
        return self._surgery(layers, len(self.new_ids) - p)

    def stale(self) -> Surgery:
        o = self.old
        return Surgery(o.layers, list(o.token_ids), list(o.segments), list(o.offsets), 0)

    def in_place(self) -> Surgery:
        layers: list[KV] = []
        computed = 0
        for b in self.blocks:
            if b.reuse:
                n = b.j2 - b.j1
                layers = join(layers, shift(cut(self.old.layers, b.i1, b.i1 + n), self.rope, b.j1 - b.i1))
            else:
                layers = extend(self.model, layers, self.new_ids[b.j1:b.j2])
                computed += b.j2 - b.j1
        return self._surgery(layers, computed)

    def selective(self, fraction: float) -> Surgery:
        base = self.in_place()
        changed = [b for b in self.blocks if not b.reuse]
        if not changed or fraction <= 0:
            return Surgery(**{**base.__dict__, "detail": f"fraction {fraction:.0%}, nothing downstream"})
        start = changed[0].j1
        downstream = [j for b in self.blocks if b.reuse and b.j1 >= start for j in range(b.j1, b.j2)]
        moved = self._movement(base.layers, start)  # [T_new - start]
        k = min(len(downstream), math.ceil(fraction * len(downstream)))
        ranked = sorted(downstream, key=lambda j: float(moved[j - start]), reverse=True)[:k]
        if has_sliding_window(self.model):
            layers = self._recompute_in_runs(base.layers, sorted(ranked))
        else:
            layers = self._recompute_in_one_pass(base.layers, sorted(ranked))
        computed = base.tokens_computed + len(ranked)
        detail = (f"{len(ranked)} of {len(downstream)} downstream tokens ({fraction:.0%}), "
                  f"ranked by layer-{SELECTION_LAYERS} K/V movement")
        return self._surgery(layers, computed, detail)

    def _recompute_in_runs(self, layers: list[KV], selected: list[int]) -> list[KV]:
        """Selected tokens recomputed run by run, in order (for models whose sliding windows one
        custom mask cannot express); runs closer than GAP_MERGE are merged."""
        out = cut(layers, 0, selected[0]) if selected else layers
        pos = selected[0] if selected else len(self.new_ids)
        for r1, r2 in _runs(selected, GAP_MERGE):
            out = join(out, cut(layers, pos, r1))
            out = extend(self.model, out, self.new_ids[r1:r2])
            pos = r2
        return join(out, cut(layers, pos, len(self.new_ids)))

    @torch.inference_mode()
    def _recompute_in_one_pass(self, layers: list[KV], selected: list[int]) -> list[KV]:
        """Every selected token recomputed in ONE forward, CacheBlend-style: each sees, layer by
        layer, the reused K/V of the unselected tokens before it and the fresh K/V of the selected
        tokens before it (a custom mask over the cache + the new block, real positions); the fresh
        K/V are then written over the selected tokens' stale ones."""
        if not selected:
            return layers
        total = len(self.new_ids)
        sel = torch.tensor(selected)
        is_sel = torch.zeros(total, dtype=torch.bool)
        is_sel[sel] = True
        sees_cache = (torch.arange(total)[None, :] < sel[:, None]) & ~is_sel[None, :]
        sees_new = sel[None, :] <= sel[:, None]
        mask = torch.cat([sees_cache, sees_new], dim=1)[None, None].to(self.model.device)
        cache = cache_from_layers(layers, self.model)
        self.model(input_ids=torch.tensor([[self.new_ids[j] for j in selected]], device=self.model.device),
                   position_ids=sel[None].to(self.model.device), attention_mask=mask, cache=cache,
                   use_cache=True, logits_to_keep=1)
        out = []
        for (k, v), layer in zip(layers, cache.layers):
            k, v = k.clone(), v.clone()
            k[:, :, sel] = layer.tail_keys  # the fresh K/V of the selected tokens [1, kv, n_sel, d]
            v[:, :, sel] = layer.tail_values
            out.append((k, v))
        return out

    @torch.inference_mode()
    def _movement(self, in_place_layers: list[KV], start: int) -> torch.Tensor:
        """How far each token's K/V at layer SELECTION_LAYERS-1 moves when the first layers are re-run
        after the change, per token from `start` on: [T_new - start]."""
        n_layers = len(in_place_layers)
        stop_at = min(SELECTION_LAYERS, n_layers) - 1
        cache = cache_from_layers(cut(in_place_layers, 0, start), self.model)
        handle = None
        layers_mod = _decoder_layers(self.model)
        if layers_mod is not None and stop_at + 1 < len(layers_mod):
            handle = layers_mod[stop_at + 1].register_forward_pre_hook(_stop_forward)
        try:
            ids = torch.tensor([self.new_ids[start:]], device=self.model.device)
            self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        except _StopForward:
            pass
        finally:
            if handle is not None:
                handle.remove()
        k_new = cache.layers[stop_at].tail_keys.float()  # [1, kv, T_new - start, d]
        v_new = cache.layers[stop_at].tail_values.float()
        k_old, v_old = (t[:, :, start:].float() for t in in_place_layers[stop_at])
        return ((k_new - k_old).norm(dim=-1) + (v_new - v_old).norm(dim=-1)).sum(dim=1)[0]

    def erratum(self, erratum_ids: list[int]) -> Surgery:
        o = self.old
        return Surgery(o.layers, o.token_ids + erratum_ids, o.segments + ["erratum"] * len(erratum_ids),
                       o.offsets + [(-1, -1)] * len(erratum_ids), len(erratum_ids), pending=list(erratum_ids))

    def field_erratum(self, erratum_ids: list[int]) -> Surgery:
        base = self.in_place()
        return Surgery(base.layers, base.token_ids + erratum_ids, base.segments + ["erratum"] * len(erratum_ids),
                       base.offsets + [(-1, -1)] * len(erratum_ids), base.tokens_computed + len(erratum_ids),
                       pending=list(erratum_ids))


class _StopForward(Exception):
    pass


def _stop_forward(module, args):
    raise _StopForward


def _decoder_layers(model):
    for name in ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    return None


def has_sliding_window(model) -> bool:
    """Whether some layer attends through a sliding window (a custom 4D mask would override it)."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None) or []
    return bool(getattr(config, "sliding_window", None)) and (not types or "sliding_attention" in types)


def _runs(sorted_positions: list[int], gap: int) -> list[tuple[int, int]]:
    """Consecutive runs [start, end) of positions, merging runs separated by fewer than `gap`."""
    runs: list[list[int]] = []
    for j in sorted_positions:
        if runs and j - runs[-1][1] < gap:
            runs[-1][1] = j + 1
        else:
            runs.append([j, j + 1])
    return [(a, b) for a, b in runs]
