"""The logit lens: at the decision, each layer's residual stream read through the model's own final
norm and LM head (and its final logit soft-capping, where it has one), so the probability of
recompute's answer token can be followed layer by layer — where the decision forms, and where a
strategy's notes part from recompute's. The last layer's reading is the model's own output."""

from __future__ import annotations

import torch

from worker.engine.mechanism.masked import decoder_layers
from worker.engine.notes import KV, cache_from_layers


def final_norm(model):
    decoder = model.get_decoder()
    for name in ("norm", "final_layernorm", "ln_f"):
        if getattr(decoder, name, None) is not None:
            return getattr(decoder, name)
    raise ValueError("this model has no final norm the logit lens knows")


@torch.inference_mode()
def lens_logits(model, layers: list[KV], prompt: list[int]) -> torch.Tensor:
    """float32 [n_layers, vocab]: the logits each decoder layer's output at the prompt's last token
    would give, read through the final norm and the LM head."""
    seen: list[torch.Tensor] = []

    def keep(_module, _args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        seen.append(hidden[:, -1:])

    handles = [layer.register_forward_hook(keep) for layer in decoder_layers(model)]
    try:
        model(input_ids=torch.tensor([prompt], device=model.device), cache=cache_from_layers(layers, model),
              use_cache=True, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    norm, head = final_norm(model), model.get_output_embeddings()
    residual = torch.cat(seen, dim=0)  # [n_layers, 1, hidden]
    logits = head(norm(residual.to(head.weight.device)))[:, -1].float()
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def lens(model, layers: list[KV], prompt: list[int], answer_id: int) -> list[float]:
    """p(`answer_id`) at every layer."""
    return [float(p) for p in torch.softmax(lens_logits(model, layers, prompt), dim=-1)[:, answer_id]]
