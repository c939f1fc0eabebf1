"""Notes: what prefill leaves behind — token ids, where each token came from, and the FULL K/V.

A `Notes` is a run of cached tokens at contiguous positions `first_position ..`. Every layer keeps
every token (sliding-window layers are NOT truncated: the attention mask applies the window, so the
same notes can later be continued, re-positioned or edited). At the edges it speaks transformers'
`DynamicCache`; inside, surgery works on per-layer (keys, values) tensors
[batch=1, kv_heads, T, head_dim].
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache

from worker.engine.rope import RopeLayout, shift_keys
from worker.engine.split_attention import NotesLayer, uses_split

KV = tuple[torch.Tensor, torch.Tensor]  # (keys, values), each [1, kv_heads, T, head_dim]


def cache_from_layers(layers: list[KV], model=None) -> DynamicCache:
    """A fresh `DynamicCache` holding these very tensors — shared, not copied: its layers are
    `NotesLayer`s, which append new tokens after the notes and never write into them. With `model`
    (one attending through split attention) a forward over it copies nothing of the notes: the
    attention reads them in place (see `worker.engine.split_attention`). Without, each forward
    concatenates as transformers' own cache does."""
    config = model.config if model is not None and uses_split(model) else None
    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.layers.append(NotesLayer(k, v, config, index=i))
    return cache


def layers_of(cache: DynamicCache) -> list[KV]:
    return [(layer.keys, layer.values) for layer in cache.layers]


@dataclass
class Notes:
    """Cached tokens and their K/V.

    token_ids: [T]; offsets: per token (start, end) in `text`, (-1, -1) for tokens that are not
    document text; segments: per token, "frame" | "document" | "skill" | "erratum" | "sink";
    layers: per decoder layer (keys, values) [1, kv_heads, T, head_dim].
    """

    token_ids: list[int]
    offsets: list[tuple[int, int]]
    segments: list[str]
    layers: list[KV]
    text: str = ""
    first_position: int = 0
    rope: RopeLayout | None = field(default=None, repr=False)
    immobile_reason: str = ""  # why `rope` is None: the model's keys cannot be moved
    # notes made once from these notes and reused by every edit that starts from them (hoist's
    # layout of the document, by the tokens it holds): a sweep's edits prepare them once
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def positions(self) -> range:
        return range(self.first_position, self.first_position + self.n_tokens)

    @property
    def cache(self) -> DynamicCache:
        """A new `DynamicCache` over these notes; feeding it to the model never alters the notes."""
        return cache_from_layers(self.layers)

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def shifted(self, delta: int) -> Notes:
        """The same notes moved `delta` positions later (earlier if negative): keys re-rotated per
        layer with that layer's own RoPE; values unchanged."""
        if self.rope is None:
            from worker.engine.rope import NotPortableError

            raise NotPortableError(
                self.immobile_reason or "these notes carry no RoPE description, so they cannot be moved"
            )
        if delta == 0:
            return self
        layers = [
            (shift_keys(k, self.rope.layers[i], delta), v) for i, (k, v) in enumerate(self.layers)
        ]
        return replace(self, layers=layers, first_position=self.first_position + delta, derived={})

    def slice(self, start: int, end: int | None = None) -> Notes:
        """Tokens [start, end) of these notes, at their own positions."""
        end = self.n_tokens if end is None else end
        return replace(
            self,
            token_ids=self.token_ids[start:end],
            offsets=self.offsets[start:end],
            segments=self.segments[start:end],
            layers=[(k[:, :, start:end], v[:, :, start:end]) for k, v in self.layers],
            first_position=self.first_position + start,
            derived={},
        )


def concat(parts: list[Notes], text: str | None = None) -> Notes:
    """Notes laid end to end. Each part must already sit at the positions it will occupy."""
    parts = [p for p in parts if p.n_tokens]
    if not parts:
        raise ValueError("nothing to concatenate")
    for a, b in zip(parts, parts[1:]):
        if a.first_position + a.n_tokens != b.first_position:
            raise ValueError(
                f"notes are not contiguous: one ends at {a.first_position + a.n_tokens}, "
                f"the next starts at {b.first_position}"
            )
    n_layers = len(parts[0].layers)
    layers = [
        (
            torch.cat([p.layers[i][0] for p in parts], dim=2),
            torch.cat([p.layers[i][1] for p in parts], dim=2),
        )
        for i in range(n_layers)
    ]
    return Notes(
        token_ids=[t for p in parts for t in p.token_ids],
        offsets=[o for p in parts for o in p.offsets],
        segments=[s for p in parts for s in p.segments],
        layers=layers,
        text=parts[0].text if text is None else text,
        first_position=parts[0].first_position,
        rope=parts[0].rope,
    )
