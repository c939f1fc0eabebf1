"""Fidelity of a strategy against full recompute: at the decision position (KL, top-k, cosine) and
on the answer itself (SQuAD-normalised match and token F1).

KL(recompute ‖ strategy) of the next-token distribution is the headline number: raw-logit cosine
separates poorly on small models (unrelated baselines reach 0.95), so it is reported beside KL and
top-k agreement, never alone.
"""

from __future__ import annotations

import re
import string
from collections import Counter
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


# ---- free answers ---------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def same_answer(a: str, b: str) -> bool:
    """The two answers are the same after `normalize_answer` (so "Madrid." equals "madrid")."""
    return normalize_answer(a) == normalize_answer(b)


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 of `prediction` against `reference`, both normalised: the harmonic mean of
    token precision and recall over the bag of words (1.0 when both are empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)
