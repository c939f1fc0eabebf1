"""The Jinja environment of the pages: where templates live, autoescaping, and the few filters
every page shares (approximate token counts, number formats, counted nouns, strategy colours).

Autoescape is on for every template (Starlette's default for .html), so user text — documents,
labels, errata, skills — always renders as text, never as markup.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

from app.web.strategy_css import cached_strategy_css
from data.models import as_utc
from vocabulary import DEFAULT_STRATEGIES, EDIT_INFO, FLOOR, REFERENCE, STRATEGIES, STRATEGY_HELP, text_rules
from vocabulary.agreement import around
from vocabulary.regions import MARKED_SEGMENTS

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = ROOT / "templates"
EXAMPLES_DIR = ROOT / "examples"
HTMX_FILE = "vendor/htmx-2.0.11.min.js"

templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
# Templates are part of the release: never stat every template file on every render (a page
# includes a dozen); a changed template is read at the next start, as changed Python code is.
templates.env.auto_reload = False


def approx_tokens(text: str | None) -> int:
    """The app cannot tokenize; about four characters a token is the rule of thumb shown as '≈'."""
    return max(1, math.ceil(len(text or "") / 4)) if text else 0


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "–"
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def fmt_float(value: float | None, digits: int = 3) -> str:
    """`digits` decimals, one format in a column: a value that is not 0 but rounds to it reads
    "< 0.0001" (never "9.6e-12" beside "0.0000")."""
    if value is None:
        return "–"
    if value != 0 and round(abs(value), digits) == 0:
        return f"{'> -' if value < 0 else '< '}{10 ** -digits:.{digits}f}"
    return f"{value:.{digits}f}"


def fmt_when(value: datetime | None) -> str:
    value = as_utc(value)
    if value is None:
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return value.strftime("%Y-%m-%d")


def word_tail(text: str, n: int) -> str:
    """The end of `text` in at most about `n` characters, starting on a word ("…" when cut)."""
    if len(text) <= n:
        return text
    tail = text[-n:]
    cut = tail.find(" ")
    return "…" + (tail[cut:] if 0 <= cut < len(tail) - 1 and not text[-n - 1].isspace() else tail)


def word_head(text: str, n: int) -> str:
    """The start of `text` in at most about `n` characters, ending on a word ("…" when cut)."""
    if len(text) <= n:
        return text
    head = text[:n]
    cut = head.rfind(" ")
    return (head[:cut] if cut > 0 and not text[n].isspace() else head).rstrip() + "…"


def count(n: int | None, singular: str, plural: str | None = None) -> str:
    """'1 field', '2 fields', '0 errata' (count(n, 'erratum', 'errata')): never '1 fields'."""
    n = n or 0
    return f"{n:,} {singular if n == 1 else (plural or singular + 's')}"


def shown_safely(value: Any) -> Any:
    """Every `{{ … }}` of every template passes here (Jinja's `finalize`) before it is escaped: text
    holding a lone surrogate (what JSON's "\\ud800" or a row from before the text rules carries) is
    shown with U+FFFD in its place, so a page or an error panel that echoes any input still encodes
    as UTF-8 instead of failing with a 500 while rendering."""
    if type(value) is str and text_rules.lone_surrogate(value) is not None:
        return text_rules.mend(value)
    return value


templates.env.finalize = shown_safely
# The run's Timings block in words (issue 43: raw keys with mixed units read "timed 1 ms")
TIMING_WORDS = {"queue_wait_ms": "waited in the queue", "load_ms": "loading the model",
                "engine_ms": "the measurement (every strategy, timed rounds included)",
                "prefill": "prefill", "readout": "readout"}


def timing_lines(timings: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(words, value) per stored timing: durations in ms or s, "timed" as yes / no (decisions
    only), the decision-only reference's KL as a number; unknown keys by name."""
    out = []
    for key, value in (timings or {}).items():
        if key == "timed":
            out.append(("timed in paired rounds", "yes" if value else "no: decisions only"))
        elif key == "exact_reference_kl":
            out.append(("decision-only reference, KL to the true recompute", fmt_float(value, 2)))
        elif isinstance(value, int | float):
            out.append((TIMING_WORDS.get(key, key.removesuffix("_ms").replace("_", " ")), fmt_ms(value)))
        else:
            out.append((key.replace("_", " "), str(value)))
    return out


def answer_around(text: str | None, values: Any, width: int = 40, line: bool = False) -> Markup:
    """An answer cut around the value it names, the value marked (`vocabulary.agreement.around`):
    wherever an answer is cut, its value stays in sight. `values`: a list, or a dict's values.
    `line`: read only the answer's first line that names a value (else its first line), so a base
    model's answer that goes on with questions of its own shows its answer, not "Qu…"."""
    listed = [str(v) for v in (list(values.values()) if isinstance(values, dict) else list(values or []))]
    text = text or ""
    if line:
        lines = [part.strip() for part in text.splitlines() if part.strip()] or [""]
        text = next((part for part in lines if around(part, listed, len(part) + 1)[1]), lines[0])
    before, value, after = around(text, listed, width)
    if value and after == "…" and len(text.partition(value)[2].strip()) <= 1:  # "." is no longer than "…"
        after = text.partition(value)[2]
    marked = Markup('<mark class="answer-value">{}</mark>').format(value) if value else Markup("")
    return escape(before) + marked + escape(after)


templates.env.filters.update(approx_tokens=approx_tokens, ms=fmt_ms, f=fmt_float, when=fmt_when, count=count,
                             word_tail=word_tail, word_head=word_head, around=answer_around,
                             timing_lines=timing_lines)
templates.env.globals.update(
    STRATEGIES=STRATEGIES, STRATEGY_HELP=STRATEGY_HELP, DEFAULT_STRATEGIES=DEFAULT_STRATEGIES,
    HTMX_FILE=HTMX_FILE,
    STRATEGY_INFO=EDIT_INFO, REFERENCE=REFERENCE, FLOOR=FLOOR,  # the pages ask for roles, never names
    MARKED_SEGMENTS=MARKED_SEGMENTS,  # the segments heatmap.js marks where they start
    STRATEGY_CSS=Markup(cached_strategy_css()),
)


def render(request: Request, name: str, status_code: int = 200, **context: Any):
    """Render a page or fragment; `is_htmx` tells templates whether the request came from htmx,
    `principal` who is asking (its `csrf` token goes into every htmx request of a signed-in page)."""
    context.setdefault("is_htmx", request.headers.get("HX-Request") == "true")
    context.setdefault("principal", getattr(request.state, "principal", None))
    token = _RENDERING.set(name)
    try:
        return templates.TemplateResponse(request, name, context, status_code=status_code)
    finally:
        _RENDERING.reset(token)


# ---- templates never query -------------------------------------------------------------------------

_RENDERING: ContextVar[str | None] = ContextVar("kvnotes_rendering", default=None)


class TemplateQueried(RuntimeError):
    """A template walked into a relationship or attribute that was not loaded, so rendering it would
    have queried the database: what it shows must be in the view its page built first."""


def _refuse_while_rendering(state: ORMExecuteState) -> None:
    template = _RENDERING.get()
    if template is not None:
        raise TemplateQueried(f"template {template} queried the database while rendering: "
                              f"{str(state.statement)[:200]}")


@contextmanager
def templates_never_query() -> Iterator[None]:
    """Within the block, any ORM query made while a template renders (a lazy relationship, an
    expired attribute) raises `TemplateQueried` instead of reaching the database."""
    event.listen(Session, "do_orm_execute", _refuse_while_rendering)
    try:
        yield
    finally:
        event.remove(Session, "do_orm_execute", _refuse_while_rendering)
