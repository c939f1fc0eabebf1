"""Re-positioning cached keys: move notes by Δ positions without running the model.

transformers caches keys AFTER RoPE. With the rotate_half pairing (dimension i with i + d/2), a key
computed at position p is k_p = m·(k·cos(pθ) + rotate_half(k)·sin(pθ)), where m is the rope type's
attention factor (1 except YaRN / LongRoPE). Rotations compose, so moving it to p + Δ is

    k_{p+Δ} = k_p·cos(Δθ) + rotate_half(k_p)·sin(Δθ)

with the layer's OWN inverse frequencies θ and NO second factor m (it is already inside k_p).
Values carry no position and never move.

Everything per layer, read from the model itself rather than from a guess about its config:
- per-layer bases (Gemma 3: sliding layers base 10k, global layers 1e6) come from the rotary module's
  `<layer_type>_inv_freq` buffer chosen by `config.layer_types[i]`;
- partial rotary (Phi, GPT-NeoX, StableLM) rotates the first `2·len(θ)` dimensions of each head only;
- linear, llama3 and YaRN scaling only change θ (and m, which we never re-apply);
- dynamic NTK makes θ depend on the sequence length, and models without RoPE (GPT-2) keep learned
  absolute positions: both are refused with `NotPortableError` naming the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from worker.engine.types import EngineError

# model types whose rotary pairs dimensions (2i, 2i+1) instead of (i, i + d/2)
_INTERLEAVED = {"gptj", "codegen", "cohere", "glm", "chatglm"}
# rope types whose θ depends on the current sequence length
_LENGTH_DEPENDENT = {"dynamic"}


class NotPortableError(EngineError):
    """The model's cached keys cannot be moved to other positions."""


@dataclass(frozen=True)
class LayerRope:
    """How one layer rotates its keys: inverse frequencies θ [rotary_dim / 2] in float32."""

    inv_freq: torch.Tensor
    rotary_dim: int
    layer_type: str = "full_attention"


@dataclass(frozen=True)
class RopeLayout:
    """The RoPE of every decoder layer of a model, in layer order."""

    layers: tuple[LayerRope, ...]

    def bases_differ(self) -> bool:
        first = self.layers[0].inv_freq
        return any(not torch.equal(lr.inv_freq, first) for lr in self.layers[1:])


def _find_rotary(model: nn.Module) -> nn.Module | None:
    for name, module in model.named_modules():
        if name.endswith("rotary_emb") or type(module).__name__.endswith("RotaryEmbedding"):
            return module
    return None


def _rope_type(rotary: nn.Module, layer_type: str) -> str:
    kind = getattr(rotary, "rope_type", "default")
    if isinstance(kind, dict):
        kind = kind.get(layer_type, "default")
    return str(kind)


def rope_layout(model: nn.Module) -> RopeLayout:
    """Read the RoPE of each decoder layer from `model`, or raise `NotPortableError`."""
    config = model.config.get_text_config(decoder=True)
    name = getattr(config, "model_type", type(model).__name__)
    rotary = _find_rotary(model)
    if rotary is None:
        raise NotPortableError(
            f"model type '{name}' has no rotary position embedding (learned absolute positions): "
            "its cached keys cannot be moved, so skills cannot be spliced and lengths cannot change in place"
        )
    if name in _INTERLEAVED:
        raise NotPortableError(
            f"model type '{name}' uses interleaved (GPT-J style) rotary pairs, "
            "which kvnotes does not re-rotate"
        )
    n_layers = config.num_hidden_layers
    layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * n_layers)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers = []
    for i in range(n_layers):
        layer_type = layer_types[i]
        kind = _rope_type(rotary, layer_type)
        if any(k in kind for k in _LENGTH_DEPENDENT):
            raise NotPortableError(
                f"model type '{name}' uses '{kind}' RoPE scaling, whose frequencies depend on the "
                "sequence length: cached keys cannot be moved exactly (recompute instead)"
            )
        inv_freq = getattr(rotary, f"{layer_type}_inv_freq", None)
        if inv_freq is None:
            inv_freq = rotary.inv_freq
        inv_freq = inv_freq.detach().to(torch.float32).cpu()
        rotary_dim = 2 * inv_freq.shape[0]
        if rotary_dim > head_dim:
            raise NotPortableError(
                f"model type '{name}': rotary dimension {rotary_dim} > head dim {head_dim}"
            )
        layers.append(LayerRope(inv_freq=inv_freq, rotary_dim=rotary_dim, layer_type=layer_type))
    return RopeLayout(layers=tuple(layers))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def shift_keys(keys: torch.Tensor, layer: LayerRope, delta: int | torch.Tensor) -> torch.Tensor:
    """Keys [..., T, head_dim] cached at positions p, re-rotated to p + delta.

    `delta` is one integer for every token, or a tensor [T] of per-token shifts. Computed in float32
    from the given keys and cast back to their dtype.
    """
    if isinstance(delta, int) and delta == 0:
        return keys
    inv_freq = layer.inv_freq.to(keys.device)
    d = torch.as_tensor(delta, dtype=torch.float32, device=keys.device).reshape(-1, 1)  # [T or 1, 1]
    angles = d * inv_freq  # [T or 1, rotary_dim / 2]
    emb = torch.cat((angles, angles), dim=-1)  # [T or 1, rotary_dim]
    cos, sin = emb.cos(), emb.sin()
    k = keys.to(torch.float32)
    rot, rest = k[..., : layer.rotary_dim], k[..., layer.rotary_dim :]
    moved = rot * cos + _rotate_half(rot) * sin
    return torch.cat((moved, rest), dim=-1).to(keys.dtype)
