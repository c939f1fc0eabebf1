"""The request streams of a replay: what each variant sends, and when.

A replay edits one field of a document again and again, as an agent loop rewrites a timestamp or a
status: request i carries `values[i % len(values)]`. Each variant is a strategy, and carries it
the way its descriptor's serving layout says (`vocabulary.replay.LAYOUT_OF`):

- `REWRITE` rewrites the field in the prompt (also what a full recompute answers from);
- `APPEND_ERRATUM` keeps the original prompt and appends an erratum (`vocabulary.render_erratum`)
  naming the old and the current value;
- `HOIST_FIELDS` moves the field's line after the document (`vocabulary.hoist`), holding the current
  value.

Each variant first sends its prompt as it stood before the edits (the warm request: the state a
serving cache is in when the loop starts; not measured). Arrivals are a Poisson process at `rate`
requests per second, the same arrival times for every variant, from a seeded generator.

The text sent is what kvnotes prefills for the same edit: the document, then the question as
`vocabulary.prompt` writes it (for the readout's `Frame.suffix` too), as the user message of the
model's chat template (the server applies the template; kvnotes's Frame renders the same one around
its document).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vocabulary import render_erratum
from vocabulary.hoist import hoist
from vocabulary.prompt import question_text
from vocabulary.replay import LAYOUT_OF, VARIANTS, ReplaySpec
from vocabulary.strategies import APPEND_ERRATUM, HOIST_FIELDS, REWRITE


@dataclass(frozen=True)
class _Span:
    """A field as `vocabulary.hoist` reads it."""

    start: int
    end: int
    new_value: str


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a variant's stream: its index, the field's value, when it arrives (seconds
    after the first) and the user message it sends."""

    variant: str
    index: int
    value: str
    arrival_s: float
    content: str


def arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """n arrival times of a Poisson process at `rate` per second, the first at 0."""
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(n):
        if i:
            now += rng.expovariate(rate)
        times.append(now)
    return times


def _rewritten(spec: ReplaySpec, field: _Span, edited: bool) -> str:
    return spec.document[:spec.start] + field.new_value + spec.document[spec.end:]


def _with_erratum(spec: ReplaySpec, field: _Span, edited: bool) -> str:
    if not edited:
        return spec.document
    return spec.document + render_erratum(spec.label, spec.old_value, field.new_value)


def _hoisted(spec: ReplaySpec, field: _Span, edited: bool) -> str:
    return hoist(spec.document, [field], values="new" if edited else "old").text


# The document as each serving layout sends it (every layout of `vocabulary.replay.REPLAY_LAYOUTS`).
LAYOUTS = {REWRITE: _rewritten, APPEND_ERRATUM: _with_erratum, HOIST_FIELDS: _hoisted}


def variant_document(spec: ReplaySpec, variant: str, value: str | None) -> str:
    """The document as `variant` sends it with the field at `value` (None: before any edit)."""
    if variant not in LAYOUT_OF:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    field = _Span(spec.start, spec.end, value if value is not None else spec.old_value)
    return LAYOUTS[LAYOUT_OF[variant]](spec, field, value is not None)


def plan_variant(spec: ReplaySpec, variant: str) -> tuple[str, list[PlannedRequest]]:
    """The warm prompt (before the edits) and the measured requests of one variant."""
    ask = question_text(spec.question, spec.choices)
    warm = variant_document(spec, variant, None) + ask
    times = arrivals(spec.total_requests, spec.rate, spec.seed)
    planned = []
    for i, at in enumerate(times):
        value = spec.values[i % len(spec.values)]
        planned.append(PlannedRequest(variant, i, value, at, variant_document(spec, variant, value) + ask))
    return warm, planned


def field_label(document: str, start: int) -> str:
    """The field's name for the erratum: the key of a `key: value` line the field is the value of
    ("destination: Oslo" → "destination"), else "the value"."""
    line_start = document.rfind("\n", 0, start) + 1
    head = document[line_start:start].rstrip()
    if head.endswith(":") and 0 < len(head) <= 60:
        return head[:-1].strip() or "the value"
    return "the value"
