"""What the run page shows, computed from a run's rows: the decision diff table (one row per
strategy against recompute), word-level differences of generated answers, the snapshot drawn
with its fields, and the token alignment the attention difference needs.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import numpy as np

from data.contracts import RunSnapshot, SnapshotField, TokenRecord
from data.models import Run, RunResult


@dataclass
class DecisionRow:
    strategy: str
    result: RunResult | None
    is_reference: bool
    agrees: bool
    tokens_pct: float | None  # tokens computed as % of recompute's
    speedup: float | None  # recompute latency / this latency


def decision_rows(run: Run) -> list[DecisionRow]:
    by_name = {r.strategy: r for r in run.results}
    ref = by_name.get("recompute")
    order = ["recompute", *[s for s in run.strategies if s != "recompute"]]
    order += [s for s in by_name if s not in order]
    rows = []
    for name in order:
        r = by_name.get(name)
        pct = speed = None
        if r is not None and ref is not None:
            if ref.tokens_computed:
                pct = 100.0 * r.tokens_computed / ref.tokens_computed
            if r.latency_ms:
                speed = ref.latency_ms / r.latency_ms
        agrees = True if name == "recompute" else bool(r and r.decision_matches_recompute)
        rows.append(DecisionRow(name, r, name == "recompute", agrees, pct, speed))
    return rows


def agreement_summary(rows: list[DecisionRow]) -> tuple[int, int]:
    """(strategies agreeing with recompute, strategies compared), recompute itself excluded."""
    compared = [r for r in rows if not r.is_reference and r.result is not None]
    return sum(1 for r in compared if r.agrees), len(compared)


WORD = re.compile(r"\s+|[^\s]+")


def word_diff(reference: str, other: str) -> list[tuple[str, str]]:
    """`other` against `reference`, word by word: [(op, text)] with op equal | insert | delete."""
    a, b = WORD.findall(reference), WORD.findall(other)
    out: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("equal", "".join(b[j1:j2])))
        else:
            if i2 > i1:
                out.append(("delete", "".join(a[i1:i2])))
            if j2 > j1:
                out.append(("insert", "".join(b[j1:j2])))
    return out


def answer_of(result: RunResult) -> str:
    return result.text or result.decision or ""


@dataclass(frozen=True)
class SnapshotPiece:
    """A stretch of the snapshot's document: plain text, or a field's old text with the field."""

    text: str
    field: SnapshotField | None = None


def snapshot_pieces(snapshot: RunSnapshot) -> list[SnapshotPiece]:
    """The snapshot's document as text pieces and field pieces, in order."""
    document = snapshot.document
    pieces, cursor = [], 0
    for f in sorted(snapshot.fields, key=lambda f: f.start):
        if f.start < cursor:
            continue
        pieces.append(SnapshotPiece(document[cursor : f.start]))
        pieces.append(SnapshotPiece(document[f.start : f.end], f))
        cursor = f.end
    pieces.append(SnapshotPiece(document[cursor:]))
    return [p for p in pieces if p.text or p.field is not None]


def _key(token: TokenRecord) -> tuple[str, str]:
    return (token.segment, token.text)


def align_tokens(tokens: list[TokenRecord], reference: list[TokenRecord]) -> list[int]:
    """For each token of a strategy's cache, the index of the same token in recompute's cache, or
    -1 where it has no counterpart (an erratum, a changed field, a spliced skill's seam)."""
    mapping = [-1] * len(tokens)
    matcher = difflib.SequenceMatcher(None, [_key(t) for t in reference], [_key(t) for t in tokens], autojunk=False)
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
