"""What a sweep is asked to run, checked before anything is saved: the request (`SweepCreate`, the
API's body and the notebook panel's form alike), edits given per field (`values`) or as rows
(`edits`, or a CSV / JSONL upload read by `rows_from_upload`), each checked against the notebook's
fields. Every problem is an `Unprocessable` naming its row and column; an edit whose values all
equal the old ones is skipped and counted, not run."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.schema_types import Cell, Choices, Number, QuestionText, StrategyName, Value, by_label
from app.services.errors import Unprocessable
from data.contracts import SweepEdit
from data.models import Notebook
from data.settings import get_settings
from vocabulary import DEFAULT_STRATEGIES, unknown_strategies, with_recompute
from vocabulary.sweeps import DEFAULT_THRESHOLD, ORIGINAL
from vocabulary.text_rules import visible

EXPECTED = "expected"  # the optional column of the answer a person expects


class SweepCreate(BaseModel):
    """Start a sweep: `values` ({field label: [value, …]}, one edit per value, each field swept
    separately) or `edits` ([{label: value, …, "expected": answer?}, …], one edit per row); the
    question (None: the notebook's current one), its choices (None: the current question's), the
    strategies (recompute and stale, whose decision is the original document's, always included)
    and the threshold of the policy."""

    model_config = ConfigDict(extra="forbid")

    # every text by the text rules (`app.schema_types`): a value is a field value (KVNOTES_MAX_VALUE_CHARS)
    values: by_label(list[Value]) | None = None
    edits: list[by_label(Cell)] | None = None
    question: QuestionText | None = None
    choices: Choices | None = None
    strategies: list[StrategyName] = Field(default_factory=lambda: list(DEFAULT_STRATEGIES), max_length=16)
    threshold: Number = Field(default=DEFAULT_THRESHOLD, gt=0.0, lt=1.0)

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
        if (self.values is None) == (self.edits is None):
            raise ValueError('give the edits one way: "values" ({label: [v, …]}) '
                             'or "edits" ([{label: v}, …])')
        return self


@dataclass(frozen=True)
class PlannedEdits:
    """The edits to run (in order) and how many were skipped as equal to the old values."""

    edits: list[SweepEdit]
    skipped: int
    mode: str  # "values" | "edits"


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
    if not reader.fieldnames:
        raise Unprocessable("upload", "the CSV has no header row naming the fields")
    rows = []
    for n, row in enumerate(reader, start=1):
        if None in row:
            raise Unprocessable("upload", f"row {n} has more cells than the header has columns")
        rows.append({k.strip(): (v or "") for k, v in row.items()})
    return rows


def plan_edits(notebook: Notebook, body: SweepCreate) -> PlannedEdits:
    """The edits of `body` against `notebook`'s fields, checked; raises `Unprocessable` naming the
    row and column of the first problems."""
    fields = {f.label: f for f in notebook.fields if f.label}
    if not notebook.fields:
        raise Unprocessable("values" if body.values is not None else "edits",
                            "this notebook has no fields to sweep: mark a field in its document first")
    known = ", ".join(map(repr, fields)) or "none has a label"
    edits: list[SweepEdit] = []
    skipped = 0
    if body.values is not None:
        mode = "values"
        if not body.values:
            raise Unprocessable("values", f"no field named; the notebook's fields are {known}")
        for label, values in body.values.items():
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
                edits.append(SweepEdit(position=len(edits), group=label, values={label: value}))
    else:
        mode = "edits"
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
    return PlannedEdits(edits=edits, skipped=skipped, mode=mode)
