"""Fidelity of a strategy against full recompute, at the decision position.

KL(recompute ‖ strategy) of the next-token distribution is the headline number: raw-logit cosine
separates poorly on small models (unrelated baselines reach 0.95), so it is reported beside KL and
top-k agreement, never alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOP_K = 10


@dataclass(frozen=True)
class Fidelity:
    kl_to_recompute: float
    top1_agrees: bool
    topk_overlap: int
    logit_cosine: float


def fidelity(reference: torch.Tensor, candidate: torch.Tensor, k: int = TOP_K) -> Fidelity:
    """Compare next-token logits [vocab] of `candidate` against `reference` (recompute)."""
    ref, cand = reference.double(), candidate.double()
    log_p, log_q = torch.log_softmax(ref, -1), torch.log_softmax(cand, -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum())
    top_ref = set(torch.topk(ref, k).indices.tolist())
    top_cand = set(torch.topk(cand, k).indices.tolist())
    return Fidelity(
        kl_to_recompute=max(kl, 0.0),
        top1_agrees=int(ref.argmax()) == int(cand.argmax()),
        topk_overlap=len(top_ref & top_cand),
        logit_cosine=float(torch.nn.functional.cosine_similarity(ref, cand, dim=0)),
    )
