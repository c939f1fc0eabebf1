"""The most-attended *lines and sentences* of a heatmap view: the attention the decision paid each
token of the notes (document, errata, skills), summed over the tokens of each line or sentence.
Ten rows of " the", each in its context, say little; the line that holds them says what was read.

A unit ends at a newline (before a token that opens with one, after a token that ends with one),
or after a token ending in ".", "!" or "?" when the next starts with a space, and never crosses a
segment; the attention sink (the first
`SINK_TOKENS` tokens) is left out of every sum. `lines_by_default` says when the run page shows
these rows first: when every one of the top tokens is a function word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data.contracts import TokenRecord
from vocabulary import ERRATUM
from vocabulary.regions import SINK_TOKENS

NOTE_SEGMENTS = frozenset({"document", ERRATUM, "skill"})
FUNCTION_WORDS = frozenset(
    "a an the of to in on at by for from with as and or but nor if then than that this these those it its "
    "is are was were be been being has have had do does did not no so such which who whom whose what "
    "when where while into onto over under about after before between per via".split())
MAX_CHARS = 160  # a longer unit is shown cut, with "…"


@dataclass(frozen=True)
class TopLine:
    rank: int
    start: int  # its first token, in the strategy's tokens
    end: int
    text: str  # on one line, cut at MAX_CHARS
    segment: str
    recompute: float | None  # the sum over its tokens recompute has (None: none of them)
    strategy: float
    tokens: int


def units(tokens: list[TokenRecord]) -> list[tuple[int, int]]:
    """Token ranges [start, end) of the notes' lines and sentences, in order."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    for i, token in enumerate(tokens):
        if token.segment not in NOTE_SEGMENTS or i < SINK_TOKENS:
            if start is not None:
                out.append((start, i))
            start = None
            continue
        if start is not None and tokens[start].segment != token.segment:
            out.append((start, i))
            start = None
        text = token.text
        if start is not None and "\n" in text and not text[: text.index("\n")].strip():
            out.append((start, i))  # a token that opens with a newline starts the next line
            start = None
        if start is None:
            start = i
        following = tokens[i + 1].text if i + 1 < len(tokens) else " "
        line_ends = "\n" in text and not text[text.rindex("\n"):].strip()
        if line_ends or (text.strip() and text.rstrip()[-1] in ".!?" and following[:1].isspace()):
            out.append((start, i + 1))
            start = None
    if start is not None:
        out.append((start, len(tokens)))
    return [(a, b) for a, b in out if any(t.text.strip() for t in tokens[a:b])]


def top_lines(tokens: list[TokenRecord], rv: np.ndarray, sv: np.ndarray, mapping: list[int],
              n: int = 10) -> list[TopLine]:
    """The `n` lines or sentences of the notes with the most attention in either cache (the
    strategy's `sv` over its tokens, recompute's `rv` over the tokens that correspond)."""
    rows = []
    for a, b in units(tokens):
        mine = float(np.sum(sv[a:b]))
        theirs = [float(rv[mapping[i]]) for i in range(a, b) if mapping[i] >= 0]
        text = " ".join("".join(t.text for t in tokens[a:b]).split())
        if len(text) > MAX_CHARS:
            text = text[: MAX_CHARS - 1].rstrip() + "…"
        rows.append((a, b, text, tokens[a].segment, sum(theirs) if theirs else None, mine))
    rows.sort(key=lambda r: -max(r[5], r[4] or 0.0))
    return [TopLine(k + 1, a, b, text, segment, ref, mine, b - a)
            for k, (a, b, text, segment, ref, mine) in enumerate(rows[:n])]


def lines_by_default(top_texts: list[str]) -> bool:
    """Whether the top tokens are all function words (" the", " of", …), so lines say more."""
    words = [t.strip().lower() for t in top_texts]
    return bool(words) and all(w in FUNCTION_WORDS for w in words)
