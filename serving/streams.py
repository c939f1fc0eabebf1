"""The request streams of a replay: what each variant sends, and when.

A replay edits one field of a document again and again, as an agent loop rewrites a timestamp or a
status: request i carries `values[i % len(values)]`. Three variants carry it differently:

- `in_place` rewrites the field in the prompt (also what a full recompute answers from);
- `erratum` keeps the original prompt and appends an erratum (`vocabulary.render_erratum`) naming
  the old and the current value;
- `hoist` moves the field's line after the document (`vocabulary.hoist`), holding the current value.

Each variant first sends its prompt as it stood before the edits (the warm request: the state a
serving cache is in when the loop starts; not measured). Arrivals are a Poisson process at `rate`
requests per second, the same arrival times for every variant, from a seeded generator.

The text sent is what kvnotes prefills for the same edit: the document, then the question as
`vocabulary.prompt` writes it (for the readout's `Frame.suffix` too), as the user message of the
model's chat template (the server applies the template; kvnotes's Frame renders the same one around
its document).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass

from vocabulary import render_erratum
from vocabulary.hoist import hoist
from vocabulary.prompt import question_text
from vocabulary.replay import VARIANTS


@dataclass(frozen=True)
class _Span:
    """A field as `vocabulary.hoist` reads it."""

    start: int
    end: int
    new_value: str


@dataclass(frozen=True)
class ReplaySpec:
    """What to replay: a document, the field [start, end) that changes, the values it takes in turn,
    the question, and the load (how many requests, their Poisson rate, the concurrency cap)."""

    document: str
    start: int
    end: int
    label: str
    values: tuple[str, ...]
    question: str
    choices: tuple[str, ...] = ()
    requests: int = 0  # 0: one request per value
    rate: float = 1.0  # requests per second (Poisson arrivals)
    concurrency: int = 4  # requests in flight at most
    variants: tuple[str, ...] = VARIANTS
    max_tokens: int = 16  # answer tokens generated per request
    seed: int = 0  # of the arrival times

    @property
    def old_value(self) -> str:
        return self.document[self.start:self.end]

    @property
    def total_requests(self) -> int:
        """Requests per variant."""
        return self.requests or len(self.values)

    @classmethod
    def of(cls, fields: Mapping) -> ReplaySpec:
        """A spec from stored fields of the same names (lists become tuples; other keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in names})

    def problems(self) -> list[str]:
        """Every reason this spec cannot run, each naming the field and the limit ([] when none)."""
        out = []
        if not 0 <= self.start < self.end <= len(self.document):
            out.append(f"field [{self.start}, {self.end}) must be a non-empty span inside the document "
                       f"({len(self.document)} characters)")
        if not self.values or any(not v.strip() for v in self.values):
            out.append("values: give at least one non-empty value for the field")
        if not self.question.strip():
            out.append("question: must not be empty")
        if self.choices and len(self.choices) < 2:
            out.append("choices: give at least two, or none for a free answer")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            out.append(f"variants: unknown {', '.join(map(repr, unknown)) or '(none given)'}; "
                       f"valid: {', '.join(VARIANTS)}")
        if self.requests < 0:
            out.append(f"requests: must be at least 1, got {self.requests}")
        if not self.rate > 0:
            out.append(f"rate: must be more than 0 requests per second, got {self.rate}")
        if self.concurrency < 1:
            out.append(f"concurrency: must be at least 1, got {self.concurrency}")
        if self.max_tokens < 1:
            out.append(f"max_tokens: must be at least 1, got {self.max_tokens}")
        return out

    def check(self) -> None:
        """A ValueError listing every problem, or nothing."""
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))


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


def variant_document(spec: ReplaySpec, variant: str, value: str | None) -> str:
    """The document as `variant` sends it with the field at `value` (None: before any edit)."""
    field = _Span(spec.start, spec.end, value if value is not None else spec.old_value)
    if variant == "in_place":
        return spec.document[:spec.start] + field.new_value + spec.document[spec.end:]
    if variant == "erratum":
        if value is None:
            return spec.document
        return spec.document + render_erratum(spec.label, spec.old_value, value)
    if variant == "hoist":
        return hoist(spec.document, [field], values="new" if value is not None else "old").text
    raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")


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
