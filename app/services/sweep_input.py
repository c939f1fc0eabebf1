"""What a sweep is asked to run, checked before anything is saved: the request (`SweepCreate`, the
API's body and the notebook panel's form alike), edits given per field (`values`) or as rows
(`edits`, or a CSV / JSONL upload read by `rows_from_upload`), each checked against the notebook's
fields. Values may also be generated (`generate`: timestamps, integers, decimals, dates or lines
sampled from a list; `vocabulary.sweep_values`). A value no choice names, where the choices name
the field's values, is refused naming its row, unless `extend_choices` adds it to the choices (as a
serving replay does). Every problem is an `Unprocessable` naming its row and column, and nothing is
saved; an edit whose values all equal the old ones is skipped and counted, not run."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from app.schema_types import (
    Cell,
    Choice,
    Choices,
    FieldLabel,
    Integer,
    Number,
    QuestionText,
    StrategyName,
    Value,
    by_label,
)
from app.services.errors import Unprocessable
from data.contracts import SweepEdit
from data.models import Notebook
from data.settings import get_settings
from vocabulary import unknown_strategies, with_recompute
from vocabulary.sweep_values import KIND_HELP, GenerateError, Kind, generate_values
from vocabulary.sweeps import DEFAULT_THRESHOLD, ORIGINAL, SWEEP_STRATEGIES
from vocabulary.text_rules import visible
from vocabulary.verdicts import outside_choices

EXPECTED = "expected"  # the optional column of the answer a person expects


class ValueGenerator(BaseModel):
    """N values for one field, generated: `kind` timestamps / dates (ISO 8601 `start` and `end`),
    integers / decimals (`places`) in a range, evenly spaced with both ends included; or lines
    sampled without replacement from `lines` with `seed`. `format`: strftime for timestamps and
    dates (default "%Y-%m-%d %H:%M", "%Y-%m-%d")."""

    model_config = ConfigDict(extra="forbid")

    # every text by the text rules (`app.schema_types`)
    field: FieldLabel = Field(description="the field's label")
    kind: Kind = Field(description="; ".join(f"{k}: {v}" for k, v in KIND_HELP.items()))
    count: Integer = Field(ge=1, le=1_000_000, description="how many values (at most "
                                                           "KVNOTES_MAX_SWEEP_EDITS in all)")
    start: Choice | None = None
    end: Choice | None = None
    places: Integer = Field(default=2, ge=0, le=12)
    lines: list[Value] | None = Field(default=None, max_length=100_000)
    seed: Integer = Field(default=0, ge=0, le=2**53 - 1)
    format: Choice | None = None


class SweepCreate(BaseModel):
    """Start a sweep: `values` ({field label: [value, …]}, one edit per value, each field swept
    separately) and/or `generate` (values made for a field), or `edits` ([{label: value, …,
    "expected": answer?}, …], one edit per row); the question (None: the notebook's current one),
    its choices (None: the current question's), whether values outside the choices extend them
    (`extend_choices`; else they are refused), the strategies (default: every strategy that runs
    alone; recompute and stale, whose decision is the original document's, always included), the
    threshold of the policy, and whether the sweep stops as soon as its policy is decided."""

    model_config = ConfigDict(extra="forbid")

    # every text by the text rules (`app.schema_types`): a value is a field value (KVNOTES_MAX_VALUE_CHARS)
    values: by_label(list[Value]) | None = None
    generate: list[ValueGenerator] | None = Field(default=None, max_length=16)
    edits: list[by_label(Cell)] | None = None
    question: QuestionText | None = None
    choices: Choices | None = None
    extend_choices: StrictBool = Field(default=False, description="values outside the question's choices "
                                       "are added to this sweep's choices (else refused, naming the row)")
    strategies: list[StrategyName] = Field(default_factory=lambda: list(SWEEP_STRATEGIES), max_length=16)
    threshold: Number = Field(default=DEFAULT_THRESHOLD, gt=0.0, lt=1.0)
    stop_when_decided: StrictBool = Field(default=False, description="stop as soon as the policy cannot "
                                          "change: the remaining edits are cancelled")
    timed_edits: Integer = Field(default=3, ge=0, le=1000, description="the first edits are timed in paired "
                             "rounds (the speed-ups come from them); the rest decide only, untimed")

    @field_validator("strategies")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        problem = unknown_strategies(value)
        if problem:
            raise ValueError(problem)
        names = with_recompute(value)
        return names if ORIGINAL in names else [*names, ORIGINAL]

    @model_validator(mode="after")
    def _one_source(self) -> SweepCreate:
        if (self.values is None and self.generate is None) == (self.edits is None):
            raise ValueError('give the edits one way: "values" ({label: [v, …]}) and/or "generate" '
                             '([{field, kind, count, …}]), or "edits" ([{label: v}, …])')
        return self


@dataclass(frozen=True)
class PlannedEdits:
    """The edits to run (in order) and how many were skipped as equal to the old values."""

    edits: list[SweepEdit]
    skipped: int
    mode: str  # "values" | "edits"
    extended: tuple[str, ...] = ()  # values added to the choices (`extend_choices`)


def rows_from_upload(text: str, filename: str = "") -> list[dict[str, str]]:
    """The rows of a CSV (a header row, one column per field label) or JSONL (one object a line)
    upload; JSONL when the name ends .jsonl/.ndjson or the first character is "{"."""
    stripped = text.lstrip("\ufeff").strip()
    if not stripped:
        raise Unprocessable("upload", "the file is empty: one edit per row, one column per field label")
    if filename.lower().endswith((".jsonl", ".ndjson")) or stripped.startswith("{"):
        rows = []
        for n, line in enumerate(stripped.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise Unprocessable("upload", f"line {n} is not JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise Unprocessable("upload", f"line {n} is not an object {{label: value}}")
            rows.append({str(k): "" if v is None else str(v) for k, v in row.items()})
        return rows
    reader = csv.DictReader(io.StringIO(stripped))
    if not _csv_read(reader, lambda: reader.fieldnames):
        raise Unprocessable("upload", "the CSV has no header row naming the fields")
    rows = []
    for n, row in enumerate(_csv_read(reader, lambda: list(reader)), start=1):
        if None in row:
            raise Unprocessable("upload", f"row {n} has more cells than the header has columns")
        rows.append({k.strip(): (v or "") for k, v in row.items()})
    return rows


def _csv_read(reader: csv.DictReader, read: Callable[[], Any]) -> Any:
    """`read()` of `reader`; a `csv.Error` (a cell past the csv module's own limit of 131,072
    characters, a stray quote) is `Unprocessable` on "upload" naming the line and the cap of a value."""
    try:
        return read()
    except csv.Error as exc:
        limit = get_settings().max_value_chars
        why = (f"a cell is longer than a value may be (at most {limit} characters, KVNOTES_MAX_VALUE_CHARS)"
               if "field limit" in str(exc) else f"it cannot be read as CSV ({exc})")
        raise Unprocessable("upload", f"line {reader.line_num + 1}: {why}") from None


def with_generated(body: SweepCreate, fields: dict, known: str) -> dict[str, list[str]]:
    """`body.values` with each generator's values appended to its field's list; `Unprocessable` on
    "generate.{label}" naming the problem (more values than KVNOTES_MAX_SWEEP_EDITS, an empty or
    reversed range, …)."""
    values = {label: list(v) for label, v in (body.values or {}).items()}
    limit = get_settings().max_sweep_edits
    for g in body.generate or []:
        where = f"generate.{g.field}"
        if g.field not in fields:
            raise Unprocessable(where, f"{g.field!r} names no field of this notebook; its fields are {known}")
        try:
            made = generate_values(g.kind, g.count, g.start, g.end, places=g.places, lines=g.lines,
                                   seed=g.seed, fmt=g.format, limit=limit)
        except GenerateError as exc:
            raise Unprocessable(where, f"{g.kind} for {g.field!r}: {exc}") from None
        values.setdefault(g.field, []).extend(made)
    return values


class _Choices:
    """Checks each value against the question's choices where they name the field's values; a value
    outside them is refused (naming where) or, with `extend`, remembered to extend them."""

    def __init__(self, choices: list[str] | None, extend: bool) -> None:
        self.choices, self.extend = list(choices or []), extend
        self.extended: list[str] = []

    def check(self, field, value: str, where: str, what: str) -> None:
        if not self.choices or not outside_choices([value], self.choices, [field.old_value, field.new_value]):
            return
        if not self.extend:
            raise Unprocessable(where, f"{what}: {value!r} is not among the question's choices "
                                       f"({', '.join(self.choices)}): every answer is one of them, so "
                                       "recompute and every strategy would answer another value and "
                                       "the edit could not be scored; add it to the choices, or extend "
                                       "the choices for this sweep (extend_choices)")
        if value not in self.extended:
            self.extended.append(value)


def plan_edits(notebook: Notebook, body: SweepCreate, choices: list[str] | None = None) -> PlannedEdits:
    """The edits of `body` against `notebook`'s fields and the question's `choices`, checked; raises
    `Unprocessable` naming the row and column of the first problem."""
    fields = {f.label: f for f in notebook.fields if f.label}
    mode = "values" if body.edits is None else "edits"
    if not notebook.fields:
        raise Unprocessable(mode, "this notebook has no fields to sweep: mark a field in its document first")
    known = ", ".join(map(repr, fields)) or "none has a label"
    against = _Choices(choices, body.extend_choices)
    edits: list[SweepEdit] = []
    skipped = 0
    if body.edits is None:
        swept = with_generated(body, fields, known)
        if not swept:
            raise Unprocessable("values", f"no field named; the notebook's fields are {known}")
        for label, values in swept.items():
            where = f"values.{label}"
            if label not in fields:
                raise Unprocessable(where, f"{label!r} names no field of this notebook; "
                                           f"its fields are {known}")
            if not values:
                raise Unprocessable(where, f"the value list of {label!r} is empty: give at least one value")
            for i, value in enumerate(values, start=1):
                if not value.strip():
                    raise Unprocessable(where, f"value {i} of {label!r} is empty")
                if value == fields[label].old_value:
                    skipped += 1
                    continue
                against.check(fields[label], value, where, f"value {i} of {label!r}")
                edits.append(SweepEdit(position=len(edits), group=label, values={label: value}))
    else:
        if not body.edits:
            raise Unprocessable("edits", "the edit list is empty: give at least one row")
        for row_n, row in enumerate(body.edits or [], start=1):
            values = {}
            for column, value in row.items():
                if column == EXPECTED:
                    continue
                if column not in fields:
                    raise Unprocessable("edits", f"row {row_n}, column {column!r}: names no field of this "
                                                 f"notebook; its fields are {known}")
                if not visible(value):  # the text rules' blank (a cell may be empty in the schema)
                    raise Unprocessable("edits", f"row {row_n}, column {column!r}: the value is empty")
                values[column] = value
            if not values:
                raise Unprocessable("edits", f"row {row_n}: sets no field; its columns must name fields "
                                             f"({known})")
            if all(fields[label].old_value == v for label, v in values.items()):
                skipped += 1
                continue
            for label, value in values.items():
                if value != fields[label].old_value:
                    against.check(fields[label], value, "edits", f"row {row_n}, column {label!r}")
            expected = (row.get(EXPECTED) or "").strip() if visible(row.get(EXPECTED) or "") else None
            group = next(iter(values)) if len(values) == 1 else ""
            edits.append(SweepEdit(position=len(edits), group=group, values=values, expected=expected))
    limit = get_settings().max_sweep_edits
    total = len(edits) + skipped
    if total > limit:
        raise Unprocessable(mode, f"{total} edits; a sweep takes at most {limit} (KVNOTES_MAX_SWEEP_EDITS)")
    if not edits:
        raise Unprocessable(mode, f"every edit ({skipped}) equals the field's old value: nothing to run")
    if mode == "edits" and len({e.group for e in edits}) > 1 and any(not e.group for e in edits):
        edits = [SweepEdit(position=e.position, values=e.values, expected=e.expected) for e in edits]
    return PlannedEdits(edits=edits, skipped=skipped, mode=mode, extended=tuple(against.extended))
