"""Reading where a run's decision looked: one strategy's attention vector for a view (a layer and
head, or aggregated; or any question/answer token as the query), and how far each head moved
from recompute's. Used by the JSON API (`/api/runs/{id}/attention`), the run page's layer × head
grid, and the exports, report, presentation and comparison, so every face draws the same numbers.

Attention by region (the paper's figure): the decision's attention summed over the sink, the
document before the field, the fields, the downstream notes, errata, skills and the question
(`vocabulary.regions` says which token is where), mean over layers and heads and per layer.

Impossible requests raise `Unprocessable` (422 naming the parameter); missing maps `NoAttention`
(404). Attention is stored as float16 `[layers, heads, T]`, the per-query maps as `[Q, T]`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from app.services.errors import Unprocessable
from data.contracts import TokenRecord
from data.models import RunResult
from vocabulary import REFERENCE
from vocabulary.regions import REGIONS, Span, token_regions


class NoAttention(LookupError):
    """The run kept no attention for this strategy (404)."""


@dataclass(frozen=True)
class AttentionVector:
    """Where `query` looked over `tokens`: `values` [T] for one view of one strategy."""

    strategy: str
    layer: int | None
    head: int | None
    agg: str | None
    shape: list[int]
    query: int
    decision: int
    query_start: int | None
    tokens: list[TokenRecord]
    values: np.ndarray  # float32 [T]


def results_with_attention(session: Session, run_id: int,
                           strategies: Iterable[str] | None = None) -> dict[str, RunResult]:
    """The run's results (only `strategies`, when given) with their attention blobs loaded."""
    query = (select(RunResult).where(RunResult.run_id == run_id)
             .options(undefer(RunResult.attention), undefer(RunResult.query_attention)))
    if strategies is not None:
        query = query.where(RunResult.strategy.in_(list(strategies)))
    return {r.strategy: r for r in session.scalars(query)}


def attention_vector(result: RunResult | None, strategy: str, layer: int | None = None,
                     head: int | None = None, agg: str | None = None,
                     query: int | None = None) -> AttentionVector:
    """`strategy`'s view: the decision's map for one `layer`/`head` or aggregated over the missing
    ones (`agg` mean | max), or — `query` being another question/answer token's absolute index —
    that token's map (averaged over layers and heads; the only one kept for it)."""
    if result is None or result.attention is None or not result.attention_shape:
        raise NoAttention(f"no attention for strategy {strategy}")
    shape = [int(n) for n in result.attention_shape]
    decision = result.decision_index if result.decision_index is not None else shape[2] - 1
    tokens = result.tokens or []
    if query is not None and query != decision:
        values = _query_values(result, query, shape[2], layer, head)
        return AttentionVector(strategy, None, None, "mean", shape, query, decision, result.query_start,
                               tokens, values)
    for name, value, size in (("layer", layer, shape[0]), ("head", head, shape[1])):
        if value is not None and not 0 <= value < size:
            raise Unprocessable(name,
                                f"{name}={value} is out of range: this model has {size} (0..{size - 1})")
    weights = np.frombuffer(result.attention, dtype=np.float16).reshape(shape).astype(np.float32)  # [L, H, T]
    picked = weights[layer : layer + 1] if layer is not None else weights
    picked = picked[:, head : head + 1] if head is not None else picked
    reduce = np.max if agg == "max" else np.mean
    values = reduce(picked.reshape(-1, shape[2]), axis=0)  # [T]
    shown_agg = None if (layer is not None and head is not None) else (agg or "mean")
    return AttentionVector(strategy, layer, head, shown_agg, shape, decision, decision, result.query_start,
                           tokens, values)


def _query_values(result: RunResult, query: int, n_tokens: int, layer: int | None,
                  head: int | None) -> np.ndarray:
    start = result.query_start
    if result.query_attention is None or start is None:
        raise Unprocessable("query", "this run kept only the decision's attention "
                                     "(it ran before per-token queries)")
    if not start <= query < n_tokens:
        raise Unprocessable("query", f"query={query} is not a question or answer token: "
                                     f"choose {start}..{n_tokens - 1}")
    if layer is not None or head is not None:
        raise Unprocessable("query", "per-layer and per-head maps are kept for the decision only; "
                                     "other queries are averaged over layers and heads")
    rows = np.frombuffer(result.query_attention, dtype=np.float16).reshape(-1, n_tokens)  # [Q, T]
    return rows[query - start].astype(np.float32)


def _key(token: TokenRecord) -> tuple[str, str]:
    return (token.segment, token.text)


def align_tokens(tokens: list[TokenRecord], reference: list[TokenRecord]) -> list[int]:
    """For each token of a strategy's cache, the index of the same token in recompute's cache, or
    -1 where it has no counterpart (an erratum, a changed field, a spliced skill's seam)."""
    mapping = [-1] * len(tokens)
    matcher = difflib.SequenceMatcher(None, [_key(t) for t in reference], [_key(t) for t in tokens],
                                      autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            mapping[block.b + k] = block.a + k
    return mapping


def head_differences(weights: np.ndarray, reference: np.ndarray, mapping: list[int]) -> np.ndarray:
    """Total variation between a strategy's attention and recompute's, per layer and head.
    weights [layers, heads, T], reference [layers, heads, T_ref] → [layers, heads] in [0, 1]."""
    idx = np.asarray(mapping)
    matched = idx >= 0
    diff = np.abs(weights[:, :, matched] - reference[:, :, idx[matched]]).sum(-1)
    diff += weights[:, :, ~matched].sum(-1)  # mass on tokens recompute does not have
    ref_unmatched = np.ones(reference.shape[-1], dtype=bool)
    ref_unmatched[idx[matched]] = False
    diff += reference[:, :, ref_unmatched].sum(-1)
    return diff / 2.0


@dataclass(frozen=True)
class HeadComparison:
    mapping: list[int]  # strategy token → recompute token (-1: none)
    head_diff: np.ndarray  # [layers, heads] total variation against recompute


def compare_heads(result: RunResult | None, reference: RunResult | None, strategy: str) -> HeadComparison:
    """How far each of `strategy`'s heads moved from recompute's, over aligned tokens."""
    if result is None or reference is None or result.attention is None or reference.attention is None:
        raise NoAttention(f"no attention for {strategy} and recompute")
    mapping = align_tokens(result.tokens or [], reference.tokens or [])
    w = np.frombuffer(result.attention, dtype=np.float16).reshape(result.attention_shape).astype(np.float32)
    r = (np.frombuffer(reference.attention, dtype=np.float16).reshape(reference.attention_shape)
         .astype(np.float32))
    if w.shape[:2] != r.shape[:2] or len(mapping) != w.shape[2]:
        raise Unprocessable("strategy", "the attention shapes of the two strategies do not line up")
    return HeadComparison(mapping, head_differences(w, r, mapping))


# ---- attention by region (the paper's figure) ---------------------------------------------------


@dataclass(frozen=True)
class RegionShares:
    """Where one strategy's decision looked, by region: `mean` over layers and heads, and
    `per_layer` (each layer's mean over heads). Every dict holds `REGIONS`, summing to 1."""

    strategy: str
    mean: dict[str, float]
    per_layer: list[dict[str, float]]


def _weights(result: RunResult) -> np.ndarray:
    shape = [int(n) for n in result.attention_shape or []]
    return np.frombuffer(result.attention, dtype=np.float16).reshape(shape).astype(np.float32)  # [L, H, T]


def region_shares(result: RunResult, fields: Iterable[tuple[int, int]]) -> RegionShares:
    """`result`'s decision attention summed over the regions of its tokens, normalised to 1 (the
    stored float16 rows sum to 1 within rounding)."""
    if result.attention is None or not result.attention_shape or not result.tokens:
        raise NoAttention(f"no attention for strategy {result.strategy}")
    labels = token_regions([Span(t.start, t.end, t.segment) for t in result.tokens], list(fields))
    index = np.array([REGIONS.index(label) for label in labels])
    per_layer = _weights(result).mean(axis=1)  # [L, T]
    if per_layer.shape[1] != len(index):
        raise Unprocessable("strategy", f"{result.strategy}'s attention covers {per_layer.shape[1]} tokens, "
                                        f"its token list {len(index)}")
    sums = np.zeros((per_layer.shape[0], len(REGIONS)))  # [L, regions]
    np.add.at(sums.T, index, per_layer.T)
    mean = sums.sum(0) / max(float(sums.sum()), 1e-12)
    layers = sums / np.maximum(sums.sum(1, keepdims=True), 1e-12)
    return RegionShares(result.strategy, _named(mean), [_named(row) for row in layers])


def _named(shares: np.ndarray) -> dict[str, float]:
    return {region: round(float(share), 5) for region, share in zip(REGIONS, shares)}


def attention_regions(results: dict[str, RunResult],
                      fields: Iterable[tuple[int, int]]) -> dict[str, RegionShares]:
    """Every strategy's regions (recompute first) for the results that kept attention."""
    spans = list(fields)
    order = sorted(results, key=lambda name: name != REFERENCE)
    return {name: region_shares(results[name], spans) for name in order
            if results[name].attention is not None and results[name].tokens}


@dataclass(frozen=True)
class MovedHead:
    layer: int
    head: int
    moved: float  # total variation against recompute's same head, 0..1


MOVED_AT_LEAST = 0.005  # a head whose attention moved less than 0.5% has not moved: it is not named


def heads_moved_most(comparison: HeadComparison, n: int = 3) -> list[MovedHead]:
    """The `n` heads whose decision attention moved furthest from recompute's, leaving out heads
    that moved less than `MOVED_AT_LEAST` (an exact strategy names none)."""
    diff = comparison.head_diff
    order = np.argsort(diff, axis=None)[::-1][:n]
    return [MovedHead(int(i // diff.shape[1]), int(i % diff.shape[1]), float(diff.flat[i])) for i in order
            if diff.flat[i] >= MOVED_AT_LEAST]


def run_attention_regions(session: Session, run_id: int,
                          fields: Iterable[tuple[int, int]]) -> dict[str, RegionShares]:
    """The run's attention by region for every strategy that kept attention (the API's and the
    run page's `attention_regions`); {} for a run without attention."""
    return attention_regions(results_with_attention(session, run_id), fields)
