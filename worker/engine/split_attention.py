"""Split attention: a forward after cached notes attends in two parts, merged by log-sum-exp.

After a cached prefix, transformers hands SDPA an explicit [L, P+L] mask. On the CPU that costs
three times over: with a mask, grouped-query heads are expanded (`repeat_kv` copies every cached
key and value once per query group), the kernel computes the masked upper half of the new block,
and `DynamicCache` has already concatenated the new keys onto the notes (a full copy of the notes
per forward). Yet every query sees every cached key: the mask only matters inside the new block.
So attention is split:

    cached part   q [B, H, L, d] against the notes' K/V [B, kv, P, d], no mask. The query heads of a
                  group are folded into the rows, q -> [B, kv, n_rep·L, d], so the cached keys are
                  read once, never repeated.
    new part      q against the new block's K/V [B, kv, T, d] (T >= L), causal (or its own mask).
    merge         out = Σ_part out_part · exp(lse_part − logaddexp(lse_cached, lse_new))

It is exact up to float rounding (tested against SDPA within 1e-5 on every tiny family).

It enters through transformers' attention interface as `SPLIT`, with a mask function that leaves
a plain causal mask to the attention (None) and materialises every other mask (sliding windows,
custom block masks) as SDPA would; a materialised mask is split at the cached / new boundary too.
`NotesLayer` is the cache layer that goes with it: the notes stay where they are and only new
tokens are appended; `update` hands the attention just the new block and the attention reads the
notes from the layer (`NotesLayer` falls back to concatenating when the model does not attend
through `SPLIT`). The split kernels run on the CPU (`_scaled_dot_product_flash_attention_for_cpu`
returns the log-sum-exp).

The joined path is what CUDA takes: the notes and the new block are joined and SDPA attends over
them, a plain causal forward under a lower-right causal bias (`joined_causal`: no [L, S] mask is
materialised, so CUDA keeps its fused kernels; SDPA's own `is_causal` aligns top-left, wrong after
cached notes), any other mask as given. `install(model, joined=…)` chooses it; by default a model
joins off the CPU and in any dtype but float32: in bfloat16 the split parts are each rounded to bf16
before the merge, which measured KL 3.7e-3 between prefix_reuse and recompute on smollm2-135m where
the joined path gives 0 (docs/benchmarks.md). Tests run the joined path on the CPU against the split
one.
"""

from __future__ import annotations

import threading

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

from worker.engine.attention_plan import Block, Piece, mask_plan

SPLIT = "kvnotes_split"

_slot = threading.local()  # the NotesLayer whose `update` just returned the new block, and that block


def _split_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function=causal_mask_function, attention_mask: torch.Tensor | None = None, **kwargs):
    """None for a plain causal mask (the attention applies it, aligned to the last key); any other
    mask (sliding window, padding, bidirectional) materialised exactly as SDPA's own."""
    if mask_function is causal_mask_function and attention_mask is None and kv_offset == 0:
        return None
    kwargs.pop("allow_is_causal_skip", None)
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                     allow_is_causal_skip=False, **kwargs)


def install(model, joined: bool | None = None) -> None:
    """Make `model` attend through `SPLIT` (registered once per process).

    joined: attend over the joined notes with SDPA (the CUDA path) instead of the two CPU kernels;
    None chooses by device and dtype (`joins_by_default`)."""
    if SPLIT not in AttentionInterface._global_mapping:
        AttentionInterface.register(SPLIT, split_attention_forward)
        AttentionMaskInterface.register(SPLIT, _split_mask)
    if model.config._attn_implementation != SPLIT:
        model.set_attn_implementation(SPLIT)
    model.config.kvnotes_joined = joins_by_default(model) if joined is None else bool(joined)


def joins_by_default(model) -> bool:
    """The joined path off the CPU (the split kernels are the CPU's) and in low precision."""
    return model.device.type != "cpu" or model.dtype != torch.float32


def uses_split(model) -> bool:
    return getattr(model.config, "_attn_implementation", None) == SPLIT


def joins(model) -> bool:
    """Whether `model` attends over the joined notes (the CUDA path) after cached notes."""
    return bool(getattr(model.config, "kvnotes_joined", model.device.type != "cpu"))


def splits_on_this_device(model) -> bool:
    """Whether forwards after cached notes really run as two parts (the CPU kernels)."""
    return uses_split(model) and not joins(model) and model.device.type == "cpu"


class NotesLayer(DynamicLayer):
    """A cache layer over notes that are never copied: `notes_keys` / `notes_values`
    [B, kv, P, d] (shared with whoever holds the notes, never written), then a tail of appended
    tokens [B, kv, T, d]. `keys` / `values` are the whole (notes + tail; a copy only when a tail
    exists). With `split` (a model attending through `SPLIT`), `update` returns only the tail."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, config=None, index: int = -1):
        super().__init__()
        self.notes_keys, self.notes_values = keys, values
        self.index = index  # the decoder layer this cache layer serves
        self.tail_keys: torch.Tensor | None = None
        self.tail_values: torch.Tensor | None = None
        self.config = config
        self.device, self.is_initialized = keys.device, True

    @property
    def keys(self) -> torch.Tensor | None:
        if self.tail_keys is None:
            return self.notes_keys
        return torch.cat([self.notes_keys, self.tail_keys], dim=-2)

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self.notes_keys, self.tail_keys = value, None

    @property
    def values(self) -> torch.Tensor | None:
        if self.tail_values is None:
            return self.notes_values
        return torch.cat([self.notes_values, self.tail_values], dim=-2)

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self.notes_values, self.tail_values = value, None

    @property
    def n_notes(self) -> int:
        return 0 if self.notes_keys is None else self.notes_keys.shape[-2]

    def get_seq_length(self) -> int:
        if not self.is_initialized or self.notes_keys is None:
            return 0
        return self.n_notes + (0 if self.tail_keys is None else self.tail_keys.shape[-2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized or self.notes_keys is None:
            self.lazy_initialization(key_states, value_states)
        if self.tail_keys is None:
            self.tail_keys, self.tail_values = key_states, value_states
        else:
            self.tail_keys = torch.cat([self.tail_keys, key_states], dim=-2)
            self.tail_values = torch.cat([self.tail_values, value_states], dim=-2)
        if self.config is None or self.config._attn_implementation != SPLIT or not self.n_notes:
            return self.keys, self.values
        _slot.pending = (self, self.tail_keys)
        return self.tail_keys, self.tail_values


def forget_pending() -> None:
    """Drop what an `update` left for an attention that will not run (a forward stopped early)."""
    _slot.pending = None


def _take_notes(module, key: torch.Tensor) -> NotesLayer | None:
    """The NotesLayer whose tail `key` is (its notes come first), or None when `key` is whole."""
    pending = getattr(_slot, "pending", None)
    _slot.pending = None
    if pending is None or pending[0].index != getattr(module, "layer_idx", None):
        return None  # nothing pending, or left over from a forward that stopped early
    layer, tail = pending
    if tail is not key:
        raise RuntimeError("split attention: the keys a NotesLayer returned were changed before attention; "
                           "this model cannot use NotesLayer caches")
    return layer


# ---- the two parts ------------------------------------------------------------------------------

def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
            blind: torch.Tensor | None, causal: bool,
            scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, h, M, d] against k, v [B, h, S, d] (same heads) → out [B, h, M, d], lse [B, h, M]
    (float32; −inf for a `blind` row, which sees no key)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
    lse = lse.float()
    if blind is not None:
        lse = lse.masked_fill(blind.expand_as(lse), float("-inf"))
        out = out.masked_fill(blind.expand_as(lse)[..., None], 0.0)
    return out, lse


def _cached_part(q, k, v, pieces: list[Piece], scale, row_keys: list[int] | None = None):
    """Every query against the cached K/V, query heads folded by group: q [B, H, L, d],
    k/v [B, kv, P, d] → out [B, H, L, d], lse [B, H, L]. With `row_keys`, batch row b sees its first
    row_keys[b] keys, each row attended on its own, unmasked."""
    b, h, _, d = q.shape
    kv = k.shape[1]
    rep = h // kv
    if row_keys is not None:
        parts = [_cached_part(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], pieces, scale)
                 for i, n in enumerate(row_keys)]
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])
    outs, lses = [], []
    for piece in pieces:
        n = piece.end - piece.start
        if piece.keys == 0:
            outs.append(q.new_zeros(b, h, n, d))
            lses.append(torch.full((b, h, n), float("-inf"), device=q.device))
            continue
        rows = q[:, :, piece.start:piece.end] if len(pieces) > 1 else q
        folded = rows.reshape(b, kv, rep * n, d)  # row r·n + l of group g = head g·rep + r, query l
        out, lse = _attend(folded, k[:, :, :piece.keys], v[:, :, :piece.keys], piece.bias, piece.blind,
                           False, scale)
        outs.append(out.reshape(b, h, n, d))
        lses.append(lse.reshape(b, h, n))
    if len(outs) == 1:
        return outs[0], lses[0]
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def _new_part(q, k, v, bias, blind, scale, blocks: list[Block] | None = None):
    """Queries (the last L of the new block) against the new block's K/V [B, kv, T, d]: causal,
    aligned to the last key, unless `bias` [B|1, 1, L, T] says otherwise, or `blocks` (groups of
    queries, each against the keys it sees)."""
    n, t = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)  # the new block only: small
    if blocks is not None:
        parts = [_attend(q[:, :, blk.start:blk.end], k.index_select(2, blk.cols), v.index_select(2, blk.cols),
                         blk.bias, None, False, scale) for blk in blocks]
        return torch.cat([o for o, _ in parts], dim=2), torch.cat([lse for _, lse in parts], dim=2)
    if bias is None and n == t:
        return _attend(q, k, v, None, blind, n > 1, scale)
    if bias is None and n > 1:
        sees = torch.ones(n, t, dtype=torch.bool, device=q.device).tril(t - n)
        bias = (torch.zeros(n, t, dtype=q.dtype, device=q.device)
                .masked_fill_(~sees, float("-inf"))[None, None])
    return _attend(q, k, v, bias, blind, False, scale)


def joined_causal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  scale: float | None) -> tuple[torch.Tensor, None]:
    """SDPA over the joined notes: query [B, H, L, d] (the last L tokens) against key/value
    [B, kv, S, d], each row seeing every key up to its own. SDPA's `is_causal` would align the rows
    to the FIRST keys; a lower-right causal bias says it without a materialised [L, S] mask, so CUDA
    keeps its fused kernels → (out [B, L, H, d], None)."""
    bias = causal_lower_right(query.shape[2], key.shape[2])
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, scale=scale, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def split_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention interface: query [B, H, L, d], key/value [B, kv, S, d] (the whole, or
    a NotesLayer's tail) → (out [B, L, H, d], None)."""
    notes = _take_notes(module, key)
    if notes is not None:
        k_c, v_c, k_n, v_n = notes.notes_keys, notes.notes_values, key, value
    else:
        p = key.shape[2] - query.shape[2]
        k_c, v_c, k_n, v_n = key[:, :, :p], value[:, :, :p], key[:, :, p:], value[:, :, p:]
    p = k_c.shape[2]
    config = getattr(module, "config", None)
    joined = getattr(config, "kvnotes_joined", query.device.type != "cpu")
    plain = (p == 0 or joined or query.device.type != "cpu" or dropout or kwargs.get("softcap") is not None
             or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None
             or not getattr(module, "is_causal", True) or query.shape[-1] != value.shape[-1])
    if plain:
        if notes is not None:
            key, value = torch.cat([k_c, k_n], dim=2), torch.cat([v_c, v_n], dim=2)
        if attention_mask is None and query.shape[2] > 1 and key.shape[2] > query.shape[2] and not dropout:
            return joined_causal(query, key, value, scaling)
        if _padded_step(query, key, value, attention_mask, dropout, kwargs):
            return _grouped_step(query, key, value, attention_mask, scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    cut = mask_plan(attention_mask, p, query.shape[2], query.dtype, query.shape[1] // k_c.shape[1])
    out_c, lse_c = _cached_part(query, k_c, v_c, cut.pieces, scaling, cut.row_keys)
    out_n, lse_n = _new_part(query, k_n, v_n, cut.new_bias, cut.new_blind, scaling, cut.new_pieces)
    lse = torch.logaddexp(lse_c, lse_n)
    w_c, w_n = torch.exp(lse_c - lse)[..., None], torch.exp(lse_n - lse)[..., None]  # [B, H, L, 1]
    out = out_c.float() * w_c + out_n.float() * w_n
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _padded_step(query, key, value, attention_mask, dropout, kwargs) -> bool:
    """A one-token step of a full-attention layer under a mask, grouped query heads: what a batched
    decode makes (`worker.engine.decode`), its mask only hiding the padding after a shorter row."""
    return (attention_mask is not None and query.shape[2] == 1 and not dropout
            and kwargs.get("sliding_window") is None and query.shape[1] != key.shape[1]
            and query.shape[-1] == value.shape[-1] <= 256)


def _grouped_step(query, key, value, attention_mask, scaling) -> tuple[torch.Tensor, None]:
    """SDPA with the query heads grouped in the kernel (`enable_gqa`), as transformers attends a lone
    row's unmasked step: a masked step would fold the heads into the query rows instead, which rounds
    differently in bfloat16 and changed a greedy token (gemma3-270m); masked keys add exact zeros."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None
