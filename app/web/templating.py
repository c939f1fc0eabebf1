"""The Jinja environment of the pages: where templates live, autoescaping, and the few filters
every page shares (approximate token counts, number formats, strategy colours).

Autoescape is on for every template (Starlette's default for .html), so user text — documents,
labels, errata, skills — always renders as text, never as markup.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates

from app.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = ROOT / "templates"
EXAMPLES_DIR = ROOT / "examples"
HTMX_FILE = "vendor/htmx-2.0.11.min.js"

# What each strategy recomputes, in the paper's words (tooltips and the checklist).
STRATEGY_HELP = {
    "recompute": "the reference: prefill everything again",
    "prefix_reuse": "recompute from the first field to the end (exact, what a prefix cache does)",
    "stale": "recompute nothing: the floor, the model acts on the old notes",
    "in_place": "recompute only the field's tokens; later keys re-rotated",
    "erratum": "append a correction and compute only its tokens",
    "field_erratum": "refresh the field and append the correction (the robust default)",
    "selective": "field + the downstream tokens whose notes moved most",
    "auto": "the cheapest strategy that matches field_erratum on a probe",
}
DEFAULT_STRATEGIES = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum")

templates = Jinja2Templates(directory=str(TEMPLATES_DIR))


def approx_tokens(text: str | None) -> int:
    """The app cannot tokenize; about four characters a token is the rule of thumb shown as '≈'."""
    return max(1, math.ceil(len(text or "") / 4)) if text else 0


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "–"
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def fmt_float(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if value != 0 and abs(value) < 10 ** -digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def fmt_when(value: datetime | None) -> str:
    if value is None:
        return ""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return value.strftime("%Y-%m-%d")


templates.env.filters.update(approx_tokens=approx_tokens, ms=fmt_ms, f=fmt_float, when=fmt_when)
templates.env.globals.update(
    STRATEGIES=STRATEGIES, STRATEGY_HELP=STRATEGY_HELP, DEFAULT_STRATEGIES=DEFAULT_STRATEGIES, HTMX_FILE=HTMX_FILE
)


def render(request: Request, name: str, status_code: int = 200, **context: Any):
    """Render a page or fragment; `is_htmx` tells templates whether the request came from htmx."""
    context.setdefault("is_htmx", request.headers.get("HX-Request") == "true")
    return templates.TemplateResponse(request, name, context, status_code=status_code)
