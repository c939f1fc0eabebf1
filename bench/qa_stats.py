"""Scoring and summarising the question-answering benchmark: gold F1 (CacheBlend's SQuAD
normalisation, best over the gold answers), per-strategy summaries with 95% bootstrap intervals,
and the `--json` shape of `bench_qa.py`. Plain Python (no torch): the tests import it directly.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

from worker.engine.compare import normalize_answer, token_f1

# per-example record key -> (summary key, statistic over examples)
SUMMARY = {
    "f1_gold": ("f1_gold", statistics.mean),
    "f1_vs_recompute": ("f1_vs_recompute", statistics.mean),
    "first_token_agrees": ("first_token_agrees", statistics.mean),
    "kl": ("kl_median", statistics.median),
    "ttft_speedup": ("ttft_speedup_median", statistics.median),
}


def gold_f1(prediction: str, answers: Sequence[str]) -> float:
    """Token F1 of `prediction` against the best-matching gold answer (SQuAD normalisation:
    lower case, no punctuation, no articles, single spaces)."""
    return max((token_f1(prediction, gold) for gold in answers), default=0.0)


def first_line(text: str) -> str:
    """CacheBlend keeps the first line of the generated answer."""
    return text.strip().split("\n")[0].strip()


def bootstrap(values: Sequence[float], stat: Callable[[Sequence[float]], float], rounds: int = 1000,
              seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of `stat` over `values` (examples resampled with
    replacement, `rounds` times, fixed seed)."""
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(values)
    estimates = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(rounds))
    return estimates[int(0.025 * (rounds - 1))], estimates[int(0.975 * (rounds - 1))]


def summarize(records: list[dict[str, dict[str, float]]], rounds: int = 1000) -> dict:
    """`{"examples": n, "strategies": {name: {"f1_gold", "f1_vs_recompute", "first_token_agrees",
    "kl_median", "ttft_speedup_median", and each with "_ci95": [lo, hi]}}}` from per-example
    records `{strategy: {"f1_gold", "f1_vs_recompute", "first_token_agrees", "kl", "ttft_speedup"}}`."""
    names = list(records[0]) if records else []
    out: dict = {"examples": len(records), "strategies": {}}
    for name in names:
        row: dict[str, float | list[float]] = {}
        for key, (label, stat) in SUMMARY.items():
            values = [float(r[name][key]) for r in records]
            row[label] = round(stat(values), 6)
            lo, hi = bootstrap(values, stat, rounds)
            row[f"{label}_ci95"] = [round(lo, 6), round(hi, 6)]
        out["strategies"][name] = row
    return out


__all__ = ["SUMMARY", "bootstrap", "first_line", "gold_f1", "normalize_answer", "summarize"]
