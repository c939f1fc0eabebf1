"""Batched forwards under a mask per decoder layer, and reading the decision off their logits.

Every mechanism view is a batch of variants of one forward: the same prompt after (copies of) some
notes, where each copy sees a different set of positions in some layers. transformers hands every
layer one attention mask, so each decoder layer's attention gets its own through a forward
pre-hook (`layer_masks`): the visibility a variant needs in that layer, with the sliding window of a
windowed layer applied by hand (one custom mask would otherwise drop it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from worker.engine.forward import extend
from worker.engine.mechanism.types import Reading
from worker.engine.notes import KV, cache_from_layers

BATCH = 8  # variants per forward, as the notes map patches them


def decoder_layers(model) -> list:
    return list(model.get_decoder().layers)


def windows(model) -> list[int | None]:
    """Per decoder layer: its sliding window in tokens, or None for full attention."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or []
    n = len(decoder_layers(model))
    if not window:
        return [None] * n
    return [window if (not types or types[i] == "sliding_attention") else None for i in range(n)]


@contextlib.contextmanager
def layer_masks(model, masks: list[torch.Tensor]):
    """Within the block, decoder layer i attends under `masks[i]` (bool [B, 1, L, S])."""
    handles = []
    for layer, mask in zip(decoder_layers(model), masks):
        def swap(_module, args, kwargs, mask=mask):
            kwargs["attention_mask"] = mask
            return args, kwargs
        handles.append(layer.self_attn.register_forward_pre_hook(swap, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def windowed(sees: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
             window: int | None) -> torch.Tensor:
    """`sees` [B, 1, L, S] narrowed to keys less than `window` positions behind each query
    (q_pos [B, L], k_pos [B, S])."""
    if window is None:
        return sees
    return sees & ((q_pos[:, :, None] - k_pos[:, None, :]) < window)[:, None]


def expand(layers: list[KV], batch: int) -> list[KV]:
    """The same notes `batch` times (views: nothing is copied)."""
    return [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in layers]


@torch.inference_mode()
def prompt_logits(model, layers: list[KV], prompt: list[int],
                  blocked: list[list[torch.Tensor | None]]) -> torch.Tensor:
    """The first answer token's logits after `prompt` read over the notes `layers`, once per
    variant, float32 [len(blocked), vocab]. Variant b's decision row (the prompt's last token)
    sees no key where `blocked[b][layer]` (bool [P + len(prompt)]) is True; None blocks nothing.
    Only the decision row differs between variants, so the question before it is run once, after
    the notes, and the variants go through the model `BATCH` at a time as that one row, the notes
    shared (never copied)."""
    shared = extend(model, layers, prompt[:-1])
    out = [batch_logits(model, expand(shared, len(blocked[i:i + BATCH])), prompt[-1:], blocked[i:i + BATCH])
           for i in range(0, len(blocked), BATCH)]
    return torch.cat(out)


@torch.inference_mode()
def batch_logits(model, layers: list[KV], prompt: list[int],
                 blocked: list[list[torch.Tensor | None]] | None = None) -> torch.Tensor:
    """One forward of `prompt` after a batch of notes `layers` ([B, kv, P, d] per layer): the
    first answer token's logits per copy, float32 [B, vocab] (`blocked` as in `prompt_logits`)."""
    b, past, n, device = layers[0][0].shape[0], layers[0][0].shape[2], len(prompt), model.device
    q_pos = torch.arange(past, past + n, device=device)
    k_pos = torch.arange(past + n, device=device)
    causal = (k_pos[None, :] <= q_pos[:, None])[None, None]  # [1, 1, L, S]
    masks = []
    for layer, window in enumerate(windows(model)):
        sees = windowed(causal.expand(b, -1, -1, -1), q_pos[None].expand(b, -1),
                        k_pos[None].expand(b, -1), window).clone()
        for row, per_layer in enumerate(blocked or []):
            if per_layer[layer] is not None:
                sees[row, 0, n - 1] &= ~per_layer[layer].to(device)
        masks.append(sees)
    ids = torch.tensor([prompt] * b, device=device)
    with layer_masks(model, masks):
        logits = model(input_ids=ids, position_ids=q_pos[None].expand(b, -1),
                       cache=cache_from_layers(layers, model), use_cache=True, logits_to_keep=1).logits
    return logits[:, -1].float()


@dataclass(frozen=True)
class Probe:
    """How a decision is read at the first answer token: recompute's logits there, its answer
    token, and the choices by their first token (without choices: the most probable token)."""

    reference: torch.Tensor  # float32 [vocab]
    answer_id: int
    choices: tuple[tuple[str, int], ...]
    decode: object  # tokenizer.decode

    @classmethod
    def of(cls, reference: torch.Tensor, answer_id: int, choices: list[tuple[str, int]], decode) -> Probe:
        """A probe; choices that share their first token cannot be told apart there, so the decision
        is then the most probable token."""
        distinct = len({t for _, t in choices}) == len(choices)
        return cls(reference, answer_id, tuple(choices) if distinct else (), decode)

    def decision(self, logits: torch.Tensor) -> str:
        if self.choices:
            return max(self.choices, key=lambda c: float(logits[c[1]]))[0]
        return self.decode([int(logits.argmax())])

    def read(self, logits: torch.Tensor) -> Reading:
        logp = torch.log_softmax(logits.float(), dim=-1)
        ref = torch.log_softmax(self.reference.float(), dim=-1)
        kl = float((ref.exp() * (ref - logp)).sum().clamp_min(0.0))
        return Reading(self.decision(logits), float(logp[self.answer_id].exp()), kl)
