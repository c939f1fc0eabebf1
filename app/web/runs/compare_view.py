"""Two or more runs side by side (`/compare?runs=A,B`): their verdicts strategy by strategy, and
where one strategy's decision looked in each run, on a shared colour scale, over the text that
strategy's notes actually hold — its own token records: the new values for recompute and the editing
strategies, the old ones for stale and erratum, placed skills spliced in place. The runs' texts are
aligned line by line (a long line sentence by sentence, with difflib): a line every run read alike
sits on one row; a line that differs (a new value, a reworded sentence) sits on a marked row beside
its counterpart when the two are alike (half their words match), on a row of its own otherwise, so
unrelated documents align by their common lines only. The errata and the question follow as rows
of their own."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy.orm import Session

from app.services.attention import attention_vector, results_with_attention
from app.web.runs.heatmap_view import hex_colour, scale_max, seq_colour, text_on
from app.web.runs.verdict_view import Headline, headline
from app.web.runs.view import DecisionRow, agreement_summary, decision_rows
from data.contracts import TokenRecord
from data.models import Notebook, Run
from vocabulary import ERRATUM, REFERENCE


@dataclass(frozen=True)
class Piece:
    """A stretch of one run's text drawn with one colour (its token's attention); `kind` is "field"
    inside a changed field, "skill" inside a placed skill, "" elsewhere; `differs`: a word the line
    beside it (another run's, on a marked row) does not have."""

    text: str
    bg: str = ""
    fg: str = ""
    title: str = ""
    kind: str = ""
    differs: bool = False

    @property
    def classes(self) -> str:
        names = (f"cmp-{self.kind}" if self.kind else "", "cmp-diff" if self.differs else "")
        return " ".join(n for n in names if n)


@dataclass
class Cell:
    pieces: list[Piece] = field(default_factory=list)
    changed: bool = False  # this row's text differs between the runs


@dataclass
class AlignedRow:
    label: str  # "" for the notes' own rows (document and skills), else "errata" | "question"
    cells: list[Cell]


@dataclass
class RunColumn:
    run: Run
    notebook: Notebook | None
    rows: dict[str, DecisionRow]
    agree: int
    compared: int
    best: DecisionRow | None  # the fastest strategy that gives recompute's decision
    headline: Headline | None = None  # what the run page's header says (who follows the edit)


def run_columns(session: Session, runs: list[Run]) -> list[RunColumn]:
    out = []
    for run in runs:
        rows = decision_rows(run)
        agree, compared = agreement_summary(rows)
        fast = [r for r in rows if r.agrees and r.quoted_speedup is not None]
        best = max(fast, key=lambda r: r.quoted_speedup[0], default=None)
        notebook = session.get(Notebook, run.notebook_id) if run.notebook_id else None
        said = headline(rows, bool(run.snapshot.fields)) if run.snapshot else None
        out.append(RunColumn(run, notebook, {r.strategy: r for r in rows}, agree, compared, best, said))
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
    return sorted(shared, key=lambda s: (s != REFERENCE, s))


# ---- what each run's strategy read -----------------------------------------------------------------------


BODY = ("document", "skill")  # the notes in order: the document as the strategy holds it, skills in place
TAILS = ((ERRATUM, "errata"), ("question", "question"))
UNIT_END = re.compile(r"\n|[.!?][\"')\]]*[ \t]+(?=\S)")  # a line ends at a newline, a sentence at . ! ?


@dataclass
class ReadText:
    """Text a strategy read, in the order its notes hold it: per character the token it belongs to
    (-1 where the run kept no tokens) and its kind ("field", "skill" or "")."""

    text: str = ""
    owner: list[int] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)

    def add(self, text: str, owner: int, kind: str) -> None:
        self.text += text
        self.owner += [owner] * len(text)
        self.kind += [kind] * len(text)


def read_text(tokens: Sequence[TokenRecord], segments: Sequence[str],
              fields: list[tuple[int, int]]) -> ReadText:
    """The tokens of `segments`, in order, as text: each token's own text (what its notes hold).
    A document token overlapping a changed field (document offsets) is of kind "field"; a skill's
    token is of kind "skill" (spliced: segment "skill"; read by recompute: document text that maps
    to no character of the document)."""
    out = ReadText()
    for i, tok in enumerate(tokens):
        if tok.segment in segments:
            skill = tok.segment == "skill" or (tok.segment == "document" and tok.start < 0)
            in_field = tok.in_document and any(tok.start < b and a < tok.end for a, b in fields)
            out.add(tok.text, i, "skill" if skill else "field" if in_field else "")
    return out


def plain_text(document: str, fields: list[tuple[int, int]]) -> ReadText:
    """A document as written, with no token records (runs that kept no attention)."""
    out = ReadText()
    for k, ch in enumerate(document):
        out.add(ch, -1, "field" if any(a <= k < b for a, b in fields) else "")
    return out


def units(text: str) -> list[tuple[int, int]]:
    """`text` cut into lines, and long lines into sentences: (start, end) of each, every character
    in one of them (a line keeps its newline, a sentence its trailing spaces)."""
    cuts = [0, *(m.end() for m in UNIT_END.finditer(text)), len(text)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def unit_key(text: str) -> str:
    """What makes two lines the same line: their words, whitespace aside."""
    return " ".join(text.split())


# ---- alignment, line by line ---------------------------------------------------------------------------


def aligned_units(sequences: list[list[str]]) -> list[tuple[bool, list[int | None]]]:
    """Rows of (shared, each sequence's unit index or None): units equal in every sequence sit on one
    shared row; between them, each sequence's own units pair up in order (a reworded line beside the
    line it replaces), None where a sequence has fewer. The first sequence is the pivot."""
    base = sequences[0]
    blocks = [[(0, 0, len(base))]] + [_blocks(base, other) for other in sequences[1:]]
    cuts = {0, len(base)}
    for bl in blocks[1:]:
        for a, _b, size in bl:
            cuts |= {a, a + size}
    bounds = sorted(cuts)
    rows: list[tuple[bool, list[int | None]]] = []
    ends = [0] * len(sequences)  # how far each sequence has been shown
    for lo, hi in zip(bounds, bounds[1:]):
        mapped = [_map(bl, lo, hi) for bl in blocks]
        if all(m is not None for m in mapped):
            starts = [m[0] for m in mapped]  # type: ignore[index]
            rows += _own_rows(ends, starts)
            rows += [(True, [s + k for s in starts]) for k in range(hi - lo)]
            ends = [m[1] for m in mapped]  # type: ignore[index]
    return rows + _own_rows(ends, [len(s) for s in sequences])


ALIKE = 0.5  # two different lines share a marked row only when this share of their words match


def alike(a: str, b: str) -> bool:
    """Whether two lines are one line reworded (difflib's ratio over their words ≥ `ALIKE`)."""
    return difflib.SequenceMatcher(None, a.split(), b.split(), autojunk=False).ratio() >= ALIKE


def paired_when_alike(rows: list[tuple[bool, list[int | None]]],
                      keys: list[list[str]]) -> list[tuple[bool, list[int | None]]]:
    """A marked row pairs the runs' lines only when they are alike; otherwise each run's line gets
    a row of its own (two unrelated documents align by their common lines only, and no unrelated
    line is outlined word by word against another)."""
    out: list[tuple[bool, list[int | None]]] = []
    for shared, picked in rows:
        present = [i for i, u in enumerate(picked) if u is not None]
        texts = {i: keys[i][picked[i]] for i in present}  # type: ignore[index]
        if shared or len(present) < 2 or all(alike(texts[present[0]], texts[i]) for i in present[1:]):
            out.append((shared, picked))
        else:
            out += [(False, [u if k == i else None for k, u in enumerate(picked)]) for i in present]
    return out


def common_share(rows: list[AlignedRow]) -> tuple[int, int]:
    """(lines every run shares, lines shown) of the notes' aligned rows."""
    body = [r for r in rows if r.label == ""]
    return sum(1 for r in body if not any(c.changed for c in r.cells)), len(body)


def _blocks(base: list[str], other: list[str]) -> list[tuple[int, int, int]]:
    """Matching runs of units (base index, other index, length)."""
    matcher = difflib.SequenceMatcher(None, base, other, autojunk=False)
    return [(m.a, m.b, m.size) for m in matcher.get_matching_blocks() if m.size]


def _own_rows(ends: list[int], starts: list[int]) -> list[tuple[bool, list[int | None]]]:
    """Each sequence's units [end, start) that no other shares, paired in order on marked rows."""
    depth = max(s - e for e, s in zip(ends, starts))
    return [(False, [e + k if e + k < s else None for e, s in zip(ends, starts)]) for k in range(depth)]


def _map(blocks: list[tuple[int, int, int]], lo: int, hi: int) -> tuple[int, int] | None:
    for a, b, size in blocks:
        if a <= lo and hi <= a + size:
            return (b + lo - a, b + hi - a)
    return None


# ---- the attention drawn over what each run read ----------------------------------------------------------


@dataclass
class RunAttention:
    tokens: list[TokenRecord]
    values: np.ndarray  # [T]


def run_attention(session: Session, run: Run, strategy: str) -> RunAttention:
    result = results_with_attention(session, run.id, [strategy])[strategy]
    vector = attention_vector(result, strategy)
    return RunAttention(vector.tokens, vector.values)


def _pieces(read: ReadText, start: int, end: int, att: RunAttention | None, vmax: float,
            marked: frozenset[int] = frozenset()) -> list[Piece]:
    """Characters [start, end) of `read` as pieces, one per token (or per kind without tokens), cut
    where `marked` (offsets from `start` of words that differ) begins or ends."""
    out: list[Piece] = []
    k = start
    while k < end:
        owner, kind, differs = read.owner[k], read.kind[k], k - start in marked
        j = k + 1
        while j < end and (read.owner[j], read.kind[j], j - start in marked) == (owner, kind, differs):
            j += 1
        text = read.text[k:j]
        if owner >= 0 and att is not None:
            v = float(att.values[owner])
            c = seq_colour(v, vmax)
            tip = f"{att.tokens[owner].text!r}: {v:.5f}"
            out.append(Piece(text, hex_colour(c), text_on(c), tip, kind, differs))
        else:
            out.append(Piece(text, kind=kind, differs=differs))
        k = j
    return out


WORDS = re.compile(r"\S+")


def differing_words(texts: list[str]) -> list[frozenset[int]]:
    """Per text of one marked row, the character offsets of its words that another non-empty text
    of the row does not have in line (difflib over words); nothing against an empty text (the whole
    line is the change there)."""
    words = [[(m.start(), m.end(), m.group()) for m in WORDS.finditer(t)] for t in texts]
    out = []
    for i, mine in enumerate(words):
        marked: set[int] = set()
        for j, theirs in enumerate(words):
            if j == i or not mine or not theirs:
                continue
            pair = difflib.SequenceMatcher(None, [w[2] for w in mine], [w[2] for w in theirs], autojunk=False)
            kept = {k for m in pair.get_matching_blocks() for k in range(m.a, m.a + m.size)}
            marked |= {c for k, (a, b, _) in enumerate(mine) if k not in kept for c in range(a, b)}
        out.append(frozenset(marked))
    return out


def _read_texts(runs: list[Run], attention: list[RunAttention] | None,
                segments: Sequence[str]) -> list[ReadText]:
    fields = [[(f.start, f.end) for f in r.snapshot.fields] for r in runs]
    if attention is None:
        if "document" not in segments:
            return [ReadText() for _ in runs]
        return [plain_text(r.snapshot.document, f) for r, f in zip(runs, fields)]
    return [read_text(a.tokens, segments, f) for a, f in zip(attention, fields)]


def _aligned(reads: list[ReadText], attention: list[RunAttention] | None, vmax: float,
             label: str) -> list[AlignedRow]:
    """`reads` aligned line by line: one row per aligned line or sentence."""
    spans = [units(r.text) for r in reads]
    keys = [[unit_key(r.text[a:b]) for a, b in s] for r, s in zip(reads, spans)]
    rows = []
    for shared, picked in paired_when_alike(aligned_units(keys), keys):
        bounds = [None if u is None else spans[i][u] for i, u in enumerate(picked)]
        texts = ["" if b is None else reads[i].text[b[0]:b[1]] for i, b in enumerate(bounds)]
        marks = [frozenset()] * len(texts) if shared else differing_words(texts)
        cells = []
        for i, b in enumerate(bounds):
            att = attention[i] if attention else None
            cells.append(Cell([] if b is None else _pieces(reads[i], *b, att, vmax, marks[i]), not shared))
        rows.append(AlignedRow(label, cells))
    return rows


def aligned_rows(runs: list[Run], attention: list[RunAttention] | None) -> tuple[list[AlignedRow], float]:
    """What each run's strategy read, aligned row by row and coloured by its token's attention (one
    scale for every run: the largest value away from the attention sink): the notes (document and
    skills, line by line), then the errata and the question, each a row of its own."""
    vmax = max(scale_max(a.values) for a in attention) if attention else 1.0
    rows = _aligned(_read_texts(runs, attention, BODY), attention, vmax, "")
    if attention:
        for segment, label in TAILS:
            reads = _read_texts(runs, attention, (segment,))
            if any(r.text for r in reads):
                cells = [Cell(_pieces(r, 0, len(r.text), a, vmax)) for r, a in zip(reads, attention)]
                for c in cells:
                    c.changed = len({unit_key(r.text) for r in reads}) > 1
                rows.append(AlignedRow(label, cells))
    return rows, vmax
