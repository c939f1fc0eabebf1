"""Two or more runs side by side (`/compare?runs=A,B`): their verdicts strategy by strategy, and
where one strategy's decision looked in each run, on a shared colour scale, with the documents
aligned on their characters — stretches every document shares sit on one row, and where the
documents differ (a reworded field or sentence) each run shows its own text on that row, marked.
Errata and the question, which a document diff cannot align, follow as rows of their own."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy.orm import Session

from app.services.attention import attention_vector, results_with_attention
from app.web.heatmap_view import hex_colour, scale_max, seq_colour, text_on
from app.web.run_view import DecisionRow, agreement_summary, decision_rows
from data.contracts import TokenRecord
from data.models import Notebook, Run


@dataclass(frozen=True)
class Piece:
    """A stretch of one run's text drawn with one colour (its token's attention)."""

    text: str
    bg: str = ""
    fg: str = ""
    title: str = ""
    field: bool = False


@dataclass
class Cell:
    pieces: list[Piece] = field(default_factory=list)
    changed: bool = False  # this row's text differs between the runs


@dataclass
class AlignedRow:
    label: str  # "" for document rows
    cells: list[Cell]


@dataclass
class RunColumn:
    run: Run
    notebook: Notebook | None
    rows: dict[str, DecisionRow]
    agree: int
    compared: int
    best: DecisionRow | None  # the fastest strategy that gives recompute's decision


def run_columns(session: Session, runs: list[Run]) -> list[RunColumn]:
    out = []
    for run in runs:
        rows = decision_rows(run)
        agree, compared = agreement_summary(rows)
        best = max((r for r in rows if not r.is_reference and r.agrees and r.speedup), key=lambda r: r.speedup, default=None)
        notebook = session.get(Notebook, run.notebook_id) if run.notebook_id else None
        out.append(RunColumn(run, notebook, {r.strategy: r for r in rows}, agree, compared, best))
    return out


def strategy_order(columns: list[RunColumn]) -> list[str]:
    order: list[str] = []
    for column in columns:
        order += [s for s in column.rows if s not in order]
    return order


def common_attention(runs: list[Run]) -> list[str]:
    """Strategies every run kept attention for (recompute first)."""
    sets = [{r.strategy for r in run.results if r.attention_shape} for run in runs]
    shared = set.intersection(*sets) if sets else set()
    return sorted(shared, key=lambda s: (s != "recompute", s))


# ---- character alignment ---------------------------------------------------------------------------


WORD = re.compile(r"\S+|\s+")


def _word_blocks(base: str, other: str) -> list[tuple[int, int, int]]:
    """Matching stretches (base char, other char, length), found word by word (a reworded word is
    one change, not a scatter of shared letters), then told in characters."""
    a_words, b_words = WORD.findall(base), WORD.findall(other)
    a_at, b_at = _starts(a_words), _starts(b_words)
    blocks = []
    for m in difflib.SequenceMatcher(None, a_words, b_words, autojunk=False).get_matching_blocks():
        if m.size:
            length = a_at[m.a + m.size] - a_at[m.a]
            blocks.append((a_at[m.a], b_at[m.b], length))
    return blocks


def _starts(words: list[str]) -> list[int]:
    out = [0]
    for w in words:
        out.append(out[-1] + len(w))
    return out


def aligned_spans(documents: list[str]) -> list[tuple[bool, list[tuple[int, int]]]]:
    """Rows of (shared, [(start, end) in each document]): `shared` rows hold the same text in every
    document; the rows between them hold each document's own differing text (maybe empty)."""
    base = documents[0]
    blocks = [[(0, 0, len(base))]] + [_word_blocks(base, other) for other in documents[1:]]
    # base positions covered, in every other document, by an equal block: where they map to
    cuts = {0, len(base)}
    for bl in blocks[1:]:
        for a, _b, size in bl:
            cuts |= {a, a + size}
    bounds = sorted(cuts)
    rows: list[tuple[bool, list[tuple[int, int]]]] = []
    ends = [0] * len(documents)  # how far each document has been shown
    for lo, hi in zip(bounds, bounds[1:]):
        mapped = [_map(bl, lo, hi) for bl in blocks]
        if all(m is not None for m in mapped):
            starts = [m[0] for m in mapped]  # type: ignore[index]
            if any(s > e for s, e in zip(starts, ends)):  # each document's own text before this shared stretch
                rows.append((False, [(e, s) for e, s in zip(ends, starts)]))
            rows.append((True, [m for m in mapped]))  # type: ignore[misc]
            ends = [m[1] for m in mapped]  # type: ignore[index]
    tails = [(e, len(d)) for e, d in zip(ends, documents)]
    if any(a < b for a, b in tails):
        rows.append((False, tails))
    return _merge(rows)


def _map(blocks: list[tuple[int, int, int]], lo: int, hi: int) -> tuple[int, int] | None:
    for a, b, size in blocks:
        if a <= lo and hi <= a + size:
            return (b + lo - a, b + hi - a)
    return None


def _merge(rows: list[tuple[bool, list[tuple[int, int]]]]) -> list[tuple[bool, list[tuple[int, int]]]]:
    """Adjacent shared rows become one (they are contiguous in every document)."""
    out: list[tuple[bool, list[tuple[int, int]]]] = []
    for shared, spans in rows:
        if out and shared and out[-1][0] and all(p[1] == s[0] for p, s in zip(out[-1][1], spans)):
            out[-1] = (True, [(p[0], s[1]) for p, s in zip(out[-1][1], spans)])
        else:
            out.append((shared, spans))
    return out


# ---- the attention drawn over each run's characters ------------------------------------------------------


@dataclass
class RunAttention:
    tokens: list[TokenRecord]
    values: np.ndarray  # [T]
    owner: np.ndarray  # [len(document)]: the token index covering each character, -1 where none


def run_attention(session: Session, run: Run, strategy: str) -> RunAttention:
    result = results_with_attention(session, run.id, [strategy])[strategy]
    vector = attention_vector(result, strategy)
    owner = np.full(len(run.snapshot.document), -1, dtype=np.int64)
    for i, tok in enumerate(vector.tokens):
        if tok.in_document:
            owner[max(0, tok.start) : min(len(owner), tok.end)] = i
    return RunAttention(vector.tokens, vector.values, owner)


def _pieces(document: str, start: int, end: int, att: RunAttention | None, vmax: float, fields: list[tuple[int, int]]) -> list[Piece]:
    out: list[Piece] = []
    k = start
    while k < end:
        owner = int(att.owner[k]) if att is not None else -1
        in_field = any(a <= k < b for a, b in fields)
        j = k + 1
        while j < end and (int(att.owner[j]) if att is not None else -1) == owner and any(a <= j < b for a, b in fields) == in_field:
            j += 1
        if owner >= 0 and att is not None:
            v = float(att.values[owner])
            c = seq_colour(v, vmax)
            out.append(Piece(document[k:j], hex_colour(c), text_on(c), f"{att.tokens[owner].text!r}: {v:.5f}", in_field))
        else:
            out.append(Piece(document[k:j], field=in_field))
        k = j
    return out


def aligned_rows(runs: list[Run], attention: list[RunAttention] | None) -> tuple[list[AlignedRow], float]:
    """The documents aligned row by row, each character coloured by its token's attention (one scale
    for every run: the largest value away from the attention sink), then errata and question rows."""
    vmax = max(scale_max(a.values) for a in attention) if attention else 1.0
    documents = [r.snapshot.document for r in runs]
    fields = [[(f.start, f.end) for f in r.snapshot.fields] for r in runs]
    rows = []
    for shared, spans in aligned_spans(documents):
        cells = [Cell(_pieces(documents[i], a, b, attention[i] if attention else None, vmax, fields[i]), not shared)
                 for i, (a, b) in enumerate(spans)]
        rows.append(AlignedRow("", cells))
    if attention:
        for segment, label in (("erratum", "errata"), ("skill", "skills"), ("question", "question")):
            cells = []
            for att in attention:
                pieces = []
                for i, tok in enumerate(att.tokens):
                    if tok.segment == segment:
                        c = seq_colour(float(att.values[i]), vmax)
                        pieces.append(Piece(tok.text, hex_colour(c), text_on(c), f"{tok.text!r}: {att.values[i]:.5f}"))
                cells.append(Cell(pieces))
            if any(c.pieces for c in cells):
                texts = ["".join(p.text for p in c.pieces) for c in cells]
                for c in cells:
                    c.changed = len(set(texts)) > 1
                rows.append(AlignedRow(label, cells))
    return rows, vmax
