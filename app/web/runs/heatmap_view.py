"""The attention view as the server draws it, for every view: which view a permalink names
(`?strategy=&layer=&head=&agg=&query=`, checked against the run), and the three panels —
recompute, the strategy, their difference — as coloured token cells, with the scales and the
most-attended notes (`top_tokens`). This is the one colour model: the presentation, compare, the
report and the SVG draw these cells, and the run page's script paints them (`paint`, through
`/runs/{id}/attention/paint`). The colour stops are read from `static/css/kvnotes.css`.

`query` in a permalink counts the question and answer tokens from 0 (the same token in every
strategy); the API's `query` is the absolute token index, which differs between strategies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlencode

import numpy as np
from sqlalchemy.orm import Session

from app.services.attention import align_tokens, attention_vector, results_with_attention
from app.services.errors import Unprocessable
from app.web.templating import ROOT, word_head, word_tail
from data.contracts import TokenRecord
from data.models import Run, RunResult
from vocabulary import ERRATUM, REFERENCE
from vocabulary.regions import SINK_TOKENS

STYLESHEET = ROOT / "static" / "css" / "kvnotes.css"
RGB = tuple[int, int, int]


@lru_cache(maxsize=1)
def palette() -> dict[str, RGB]:
    """Every `--name: #rrggbb;` colour variable of the stylesheet's `:root` (the light page's; the
    presentation's dark theme redefines some further down)."""
    css = STYLESHEET.read_text(encoding="utf-8")
    root = css[css.index(":root {") : css.index("}", css.index(":root {"))]
    found = re.findall(r"--([\w-]+):\s*#([0-9a-fA-F]{6})\s*;", root)
    return {name: (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)) for name, h in found}


def seq_stops() -> list[RGB]:
    return [palette()[f"seq-{i}"] for i in range(5)]


def div_stops() -> list[RGB]:
    return [palette()[n] for n in ("div-neg-2", "div-neg-1", "div-0", "div-pos-1", "div-pos-2")]


def ramp(stops: list[RGB], t: float) -> RGB:
    t = max(0.0, min(1.0, t))
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    a, b = stops[i], stops[i + 1]
    return tuple(round(a[k] + (b[k] - a[k]) * f) for k in range(3))  # type: ignore[return-value]


def hex_colour(c: RGB) -> str:
    return "#{:02x}{:02x}{:02x}".format(*c)


def luminance(c: RGB) -> float:
    """WCAG relative luminance."""
    lin = [v / 255 / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in c]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: RGB, b: RGB) -> float:
    x, y = luminance(a), luminance(b)
    return (max(x, y) + 0.05) / (min(x, y) + 0.05)


def text_on(c: RGB) -> str:
    """The text colour on a coloured token: the page's own ("") while even the
    faint grey reads at WCAG AA (4.5:1), else white or black, whichever contrasts more (≥ 4.58:1)."""
    if contrast(palette()["ink-faint"], c) >= 4.5:
        return ""
    return "#fff" if contrast((255, 255, 255), c) >= contrast((0, 0, 0), c) else "#000"


def seq_t(value: float, vmax: float) -> float:
    return 0.9 * (max(0.0, value) / vmax) ** 0.6


def div_t(delta: float, dmax: float) -> float:
    return 0.5 + 0.5 * float(np.sign(delta)) * (abs(delta) / dmax) ** 0.5


def seq_colour(value: float, vmax: float) -> RGB:
    return ramp(seq_stops(), seq_t(value, vmax))


def div_colour(delta: float, dmax: float) -> RGB:
    return ramp(div_stops(), div_t(delta, dmax))


# The dark variant: a cell's light colours go inline (`bg`, `fg`), its dark ones are a class (`dark`),
# its position on scales that start from the dark paper, whose rules (`dark_css`) apply under a
# dark theme only; one page serves both schemes without scripts. Zero attention: the dark paper.

DARK_LEVELS = 32  # steps of the dark scales (the diverging one has DARK_LEVELS + 1: its middle is 0)


def dark_class(scale: str, t: float) -> str:
    """`dk-s{k}` (attention) or `dk-d{k}` (difference): the level of position `t` (0 … 1)."""
    return f"dk-{scale}{round(max(0.0, min(1.0, t)) * DARK_LEVELS)}"


def dark_text_on(c: RGB) -> str:
    """The text colour on a dark-scale cell: the dark page's own ink while even its faint grey reads
    at WCAG AA (4.5:1), else white or black, whichever contrasts more."""
    if contrast(palette()["dark-ink-faint"], c) >= 4.5:
        return "var(--ink)"
    return "#fff" if contrast((255, 255, 255), c) >= contrast((0, 0, 0), c) else "#000"


def dark_colours() -> dict[str, tuple[str, str]]:
    """Each dark class's background and text colour."""
    out = {}
    seq = [palette()[f"seq-dark-{i}"] for i in range(5)]
    div = [palette()[f"div-dark-{n}"] for n in ("neg-2", "neg-1", "0", "pos-1", "pos-2")]
    for scale, stops in (("s", seq), ("d", div)):
        for k in range(DARK_LEVELS + 1):
            c = ramp(stops, k / DARK_LEVELS)
            out[f"dk-{scale}{k}"] = (hex_colour(c), dark_text_on(c))
    return out


@lru_cache(maxsize=1)
def dark_css() -> str:
    """The dark classes' rules, and the legends' dark scales, for a page with a dark theme (the slides): under
    `data-theme="dark"`, or the system's dark scheme unless the reader chose light."""
    colours = dark_colours()
    rules = [f".tok.{name}{{background-color:{bg}!important;color:{fg}!important}}"
             for name, (bg, fg) in colours.items()]
    rules += [f".ramp.ramp-{k}{{background:linear-gradient(90deg,"  # the legends' scales
              + ",".join(colours[f"dk-{k}{i * DARK_LEVELS // 4}"][0] for i in range(5)) + ")!important}"
              for k in "sd"]
    chosen = "".join(f'html.present-mode[data-theme="dark"] {r}' for r in rules)
    system = "".join(f'html.present-mode:not([data-theme="light"]) {r}' for r in rules)
    return f"{chosen}\n@media (prefers-color-scheme: dark) {{ {system} }}"


GRID_ZERO = 0.005  # a head whose attention moved less than this (0.5%) draws as no change


def grid_colour(moved: float) -> str:
    """A layer × head cell: how far the head's attention moved from recompute (total variation,
    0 … 1), on the warm half of the diverging scale, square-root spaced."""
    shown = 0.0 if moved < GRID_ZERO else min(1.0, moved)
    return hex_colour(ramp(div_stops()[2:], shown ** 0.5))


def ramps() -> dict[str, list[str]]:
    """The legends' colour stops: attention, the difference, and the grid's."""
    div = [hex_colour(c) for c in div_stops()]
    return {"seq": [hex_colour(c) for c in seq_stops()], "div": div, "grid": div[2:]}


def scale_max(values: np.ndarray) -> float:
    """The colour scale's top: the largest value away from the first token (the attention sink)."""
    rest = np.abs(values[1:]) if len(values) > 1 else np.zeros(1)
    return float(rest.max()) if rest.size and rest.max() > 0 else 1e-9


# ---- which view --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewParams:
    strategy: str
    layer: int | None = None
    head: int | None = None
    agg: str = "mean"
    query: int | None = None  # question/answer token number from 0; None: the decision

    def query_string(self, **extra: str) -> str:
        pairs = [("strategy", self.strategy)]
        pairs += [(k, str(v))
                  for k, v in (("layer", self.layer), ("head", self.head), ("query", self.query))
                  if v is not None]
        if self.agg != "mean":
            pairs.append(("agg", self.agg))
        return urlencode(pairs + list(extra.items()))

    @property
    def label(self) -> str:
        if self.query is not None:
            kept = self.decision_label
            return (f"query={self.query} (question and answer tokens counted from 0), mean over layers "
                    f"and heads; the decision's view ({kept}) is kept")
        return self.decision_label

    @property
    def decision_label(self) -> str:
        if self.layer is None:
            return f"all layers, {self.agg} over heads"
        if self.head is None:
            return f"layer {self.layer}, {self.agg} over heads"
        return f"layer {self.layer}, head {self.head}"


def view_params(run: Run, with_attention: list[str], default: str | None, strategy: str | None = None,
                layer: int | None = None, head: int | None = None, agg: str | None = None,
                query: int | None = None) -> ViewParams | None:
    """The view a permalink names, checked against `run` (None when the run has no attention);
    anything it cannot show raises `Unprocessable` naming the parameter and what it can be."""
    choices = [s for s in with_attention if s != REFERENCE]
    if not choices or REFERENCE not in with_attention:
        return None
    chosen = strategy or (default if default in choices else choices[0])
    if chosen not in choices:
        raise Unprocessable("strategy", f"run {run.id} has no attention for {chosen!r}; "
                                        f"choose one of {', '.join(choices)}")
    if agg not in (None, "", "mean", "max"):
        raise Unprocessable("agg", f"agg is mean or max; got {agg[:20]!r}")
    by_name = {r.strategy: r for r in run.results}
    shape = [int(n) for n in by_name[chosen].attention_shape or [0, 0, 0]]
    for name, value, size in (("layer", layer, shape[0]), ("head", head, shape[1])):
        if value is not None and value >= size:
            raise Unprocessable(name,
                                f"{name}={value} is out of range: this model has {size} (0..{size - 1})")
    if head is not None and layer is None:
        raise Unprocessable("head", "a head is picked within a layer: give layer= too")
    if query is not None:  # a query's map is the mean over layers and heads; layer/head/agg are kept
        count = min(_query_count(by_name[REFERENCE]), _query_count(by_name[chosen]))
        if query >= count:
            raise Unprocessable("query",
                                f"query={query} is past the question and answer tokens (0..{count - 1})")
    return ViewParams(chosen, layer, head, agg or "mean", query)


def _query_count(result: RunResult) -> int:
    shape = result.attention_shape or [0, 0, 0]
    return 0 if result.query_start is None else int(shape[2]) - result.query_start


# ---- the three panels --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    text: str
    segment: str
    value: float
    bg: str
    fg: str  # "" (the page's colour), or "#fff" / "#000" where that would not read (`text_on`)
    title: str
    unmatched: bool = False
    sign: str = ""  # pos | neg: the difference, also drawn as an underline for greyscale
    query: bool = False
    dark: str = ""  # the dark variant's class (`dark_class`): its colours under a dark theme


@dataclass(frozen=True)
class TopToken:
    rank: int
    index: int  # in the strategy's tokens
    ref_index: int  # in recompute's (-1: none)
    text: str
    segment: str
    recompute: float | None
    strategy: float
    before: str = ""  # the text just before it in its segment (which " the" this is)
    after: str = ""

    @property
    def inline(self) -> str:
        """The token on one line, as it sits between `before` and `after`."""
        return _one_line(self.text)

    @property
    def change(self) -> str:
        if self.recompute is None:
            return "new"
        d = self.strategy - self.recompute
        return f"{d:+.4f}" + (" ▲" if d > 0 else " ▽" if d < 0 else "")


@dataclass(frozen=True)
class HeatmapPanels:
    params: ViewParams
    ref: list[Cell]
    res: list[Cell]
    diff: list[Cell]
    vmax: float
    dmax: float
    top: list[TopToken]
    ref_tokens: list[TokenRecord]
    res_tokens: list[TokenRecord]
    ref_values: np.ndarray
    res_values: np.ndarray
    mapping: list[int]


def heatmap_panels(session: Session, run_id: int, params: ViewParams,
                   results: dict[str, RunResult] | None = None) -> HeatmapPanels:
    results = results or results_with_attention(session, run_id, [REFERENCE, params.strategy])
    ref_r, res_r = results[REFERENCE], results[params.strategy]

    def vector(result: RunResult, name: str):
        query = (None if params.query is None or result.query_start is None
                 else result.query_start + params.query)
        if query is not None:  # the per-query maps are kept as the mean over layers and heads only
            return attention_vector(result, name, None, None, "mean", query)
        return attention_vector(result, name, params.layer, params.head, params.agg, query)

    ref, res = vector(ref_r, REFERENCE), vector(res_r, params.strategy)
    mapping = align_tokens(res.tokens, ref.tokens)
    rv, sv = ref.values, res.values
    diff = np.array([sv[i] - rv[j] if j >= 0 else sv[i] for i, j in enumerate(mapping)], dtype=np.float32)
    vmax, dmax = max(scale_max(rv), scale_max(sv)), scale_max(diff)
    inverse = [-1] * len(ref.tokens)
    for i, j in enumerate(mapping):
        if j >= 0:
            inverse[j] = i

    def tip(r: int, s: int) -> str:
        a = f"{rv[r]:.5f}" if r >= 0 else "—"
        b = f"{sv[s]:.5f}" if s >= 0 else "—"
        return f"recompute {a} · {params.strategy} {b}"

    def seq_cell(tok: TokenRecord, v: float, query: bool, title: str) -> Cell:
        t = seq_t(float(v), vmax)
        c = ramp(seq_stops(), t)
        return Cell(tok.text, tok.segment, float(v), hex_colour(c), text_on(c), title, query=query,
                    dark=dark_class("s", t))

    ref_cells = [seq_cell(t, rv[j], j == ref.query, tip(j, inverse[j])) for j, t in enumerate(ref.tokens)]
    res_cells = [seq_cell(t, sv[i], i == res.query, tip(mapping[i], i)) for i, t in enumerate(res.tokens)]
    diff_cells = []
    for i, t in enumerate(res.tokens):
        d = float(diff[i])
        c = div_colour(d, dmax)
        sign = "pos" if d > 0.1 * dmax else "neg" if d < -0.1 * dmax else ""
        diff_cells.append(Cell(t.text, t.segment, d, hex_colour(c), text_on(c),
                               tip(mapping[i], i) + f" · difference {d:+.5f}", mapping[i] < 0, sign,
                               i == res.query, dark_class("d", div_t(d, dmax))))
    return HeatmapPanels(params, ref_cells, res_cells, diff_cells, vmax, dmax,
                         top_tokens(res.tokens, rv, sv, mapping), ref.tokens, res.tokens, rv, sv, mapping)


WORDY = re.compile(r"[^\W_]")  # a word has a letter or a digit
NOTE_SEGMENTS = frozenset({"document", ERRATUM, "skill"})  # the notes: not the frame or the question
CONTEXT_CHARS = 24


def is_word(i: int, token: TokenRecord) -> bool:
    """Whether the most-attended list shows this token by default: not the sink (the first 4
    tokens), not whitespace or punctuation alone."""
    return i >= SINK_TOKENS and bool(WORDY.search(token.text))


def top_tokens(tokens: list[TokenRecord], rv: np.ndarray, sv: np.ndarray, mapping: list[int],
               n: int = 10, words: bool = True) -> list[TopToken]:
    """The notes (document, errata, skills) the view attends to most in either cache, each with the
    text around it; `words` leaves out the sink, whitespace and punctuation. The one ranking the
    run page (through `/runs/{id}/attention/top`), the report, the presentation and the exports show."""
    candidates = [i for i in range(1, len(tokens))
                  if tokens[i].segment in NOTE_SEGMENTS and (not words or is_word(i, tokens[i]))]
    order = sorted(candidates,
                   key=lambda i: -max(float(sv[i]), float(rv[mapping[i]]) if mapping[i] >= 0 else 0.0))
    return [TopToken(k + 1, i, mapping[i], tokens[i].text, tokens[i].segment,
                     float(rv[mapping[i]]) if mapping[i] >= 0 else None, float(sv[i]),
                     *_context(tokens, i))
            for k, i in enumerate(order[:n])]


def _one_line(text: str) -> str:
    return text.replace("\n", " ").replace("\t", " ")


def _context(tokens: list[TokenRecord], i: int) -> tuple[str, str]:
    """Up to CONTEXT_CHARS of the text either side of token `i` within its segment, on one line."""
    def gather(step: int) -> str:
        text, j = "", i + step
        while 0 <= j < len(tokens) and tokens[j].segment == tokens[i].segment and len(text) < CONTEXT_CHARS:
            text = tokens[j].text + text if step < 0 else text + tokens[j].text
            j += step
        return _one_line(text)

    before, after = gather(-1), gather(1)
    return word_tail(before, CONTEXT_CHARS), word_head(after, CONTEXT_CHARS)


def paint(p: HeatmapPanels) -> dict:
    """What the run page's script paints the three panels with, the colours all computed here:
    per token its background and text colour (`""`: the page's), the difference's sign (`pos` |
    `neg` | `""`) and whether it has a counterpart in recompute, and the scales' tops."""
    def side(cells: list[Cell]) -> dict[str, list[str]]:
        return {"bg": [c.bg for c in cells], "fg": [c.fg for c in cells]}

    return {"ref": side(p.ref), "res": side(p.res),
            "diff": {**side(p.diff), "sign": [c.sign for c in p.diff],
                     "unmatched": [c.unmatched for c in p.diff]},
            "vmax": round(p.vmax, 6), "dmax": round(p.dmax, 6), "label": p.params.label}
