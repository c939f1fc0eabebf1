"""How split attention attends under a mask (`worker.engine.split_attention`): the mask of one forward
after cached notes, planned once for all its layers.

    cached part   every key visible: one piece, no bias; each batch row seeing its own first keys
                  (stacked notes of different lengths): each row attended on its own, unmasked
                  (`Cut.row_keys`); anything else: row groups (`ROW_GROUPS`), each reading keys only
                  up to the last one any of its rows sees, under the mask's bias.
    new block     causal: no bias; a tree (a readout over orders, each order seeing the common
                  beginning and itself): `BLOCK_ROWS` queries at a time against only the keys they
                  see (`Cut.new_pieces`), when that skips at least half the pairs; else the bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# a masked cached part is cut into this many row groups, each reading keys up to its last visible one
ROW_GROUPS = 8


@dataclass
class Piece:
    """Queries [start, end) against the cached keys [0, keys): the bias already repeated for the
    folded query heads [B|1, 1, rep·(end − start), keys], and the rows that see no cached key."""

    start: int
    end: int
    keys: int
    bias: torch.Tensor | None = None
    blind: torch.Tensor | None = None  # [B|1, 1, rep·(end − start)] bool


@dataclass
class Cut:
    """A forward's mask cut at the notes: the cached part as row pieces (or, `row_keys`, each batch
    row seeing its own first keys, unmasked), and the new block's bias (or its `new_pieces`)."""

    pieces: list[Piece]
    new_bias: torch.Tensor | None = None
    new_blind: torch.Tensor | None = None
    row_keys: list[int] | None = None
    new_pieces: list[Block] | None = None


@dataclass
class Block:
    """New-block queries [start, end) against only the new keys any of them sees (`cols`), under
    the mask's bias for those [B|1, 1, end − start, len(cols)]."""

    start: int
    end: int
    cols: torch.Tensor
    bias: torch.Tensor


# the new block of a tree-masked forward (a readout over orders) is cut into query rows this many at
# a time, each reading only the keys one of them sees: its order's question and the common beginning
BLOCK_ROWS = 48


def visible(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def bias_of(sees: torch.Tensor, dtype: torch.dtype,
             rep: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(additive bias, blind rows) of a visibility mask [B|1, 1, M, S], repeated `rep` times along
    the rows for folded heads; (None, None) when everything is visible."""
    if bool(sees.all()):
        return None, None
    bias = torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill_(~sees, float("-inf"))
    blind = ~sees.any(dim=-1)
    if rep > 1:
        bias, blind = bias.repeat(1, 1, rep, 1), blind.repeat(1, 1, rep)
    return bias, (blind if bool(blind.any()) else None)


def _plan(mask: torch.Tensor | None, p: int, n: int, dtype: torch.dtype, rep: int) -> Cut:
    """How to attend under `mask` [B|1, 1, L, P+T] (None: every cached key, the new block causally).
    A masked cached part is cut into row groups that each read keys only up to the last one any of
    their rows sees (the selected tokens of CacheBlend-style recompute see keys before their own
    position: the groups skip most of the masked half)."""
    if mask is None:
        return Cut([Piece(0, n, p)])
    sees_c, sees_n = visible(mask[..., :p]), visible(mask[..., p:])
    new_bias, new_blind = bias_of(sees_n, dtype, 1)
    blocks = _blocks(sees_n, new_bias) if new_blind is None else None
    if blocks is not None:
        new_bias = None
    if bool(sees_c.all()):
        return Cut([Piece(0, n, p)], new_bias, new_blind, new_pieces=blocks)
    first = sees_c[:, 0, 0, :]  # [B|1, P]: a batch row whose every query sees its own first keys
    keys = first.sum(dim=-1)
    if first.shape[0] > 1 and bool(keys.min() > 0) and bool((sees_c == first[:, None, None, :]).all()) \
            and bool((first == (torch.arange(p, device=mask.device)[None, :] < keys[:, None])).all()):
        return Cut([Piece(0, n, p)], new_bias, new_blind, row_keys=keys.tolist(), new_pieces=blocks)
    last = torch.where(sees_c, torch.arange(p, device=mask.device), -1).amax(dim=-1).amax(dim=0)[0]  # [L]
    groups = max(1, min(ROW_GROUPS, n // 32))
    bounds = [round(i * n / groups) for i in range(groups + 1)]
    pieces = []
    for start, end in zip(bounds, bounds[1:]):
        keys = int(last[start:end].max()) + 1
        bias, blind = bias_of(sees_c[..., start:end, :keys], dtype, rep) if keys else (None, None)
        pieces.append(Piece(start, end, keys, bias, blind))
    return Cut(pieces, new_bias, new_blind, new_pieces=blocks)


def _blocks(sees: torch.Tensor, bias: torch.Tensor | None) -> list[Block] | None:
    """The new block's queries `BLOCK_ROWS` at a time, each group against only the keys one of its
    rows sees, when that skips at least half the block's query-key pairs (a tree of orders: each
    order's rows see the common beginning and their own order only); None otherwise."""
    if bias is None:
        return None
    n, t = sees.shape[-2], sees.shape[-1]
    if n != t or n < 2 * BLOCK_ROWS:
        return None
    blocks, pairs = [], 0
    for start in range(0, n, BLOCK_ROWS):
        end = min(start + BLOCK_ROWS, n)
        cols = sees[:, 0, start:end, :].any(dim=1).any(dim=0).nonzero().flatten()
        blocks.append(Block(start, end, cols, bias[:, :, start:end].index_select(-1, cols)))
        pairs += (end - start) * len(cols)
    return blocks if 2 * pairs <= n * t else None


_memo: dict[tuple, tuple[torch.Tensor, Cut]] = {}


def mask_plan(mask: torch.Tensor | None, p: int, n: int, dtype: torch.dtype, rep: int) -> Cut:
    """`_plan`, remembered by the mask's identity: one mask serves every layer of a forward."""
    if mask is None:
        return Cut([Piece(0, n, p)])
    key = (id(mask), p, n, dtype, rep)
    hit = _memo.get(key)
    if hit is not None and hit[0] is mask:
        return hit[1]
    if len(_memo) > 8:
        _memo.clear()
    cut = _plan(mask, p, n, dtype, rep)
    _memo[key] = (mask, cut)
    return cut
