"""Pydantic models of the HTTP JSON API: what a client may send (with its limits) and what it gets.

Limits come from settings, read when a request is validated (`at_most`; never once at import), so a
request over one answers 422 with the field's location, the limit and its variable in the message. Run results use
the engine's JSON names (`kvnotes edit --json`): decision, choice_probs, kl_to_recompute, ...
The run snapshot and the token records are the data layer's contracts (`data.contracts`).

Every request model refuses what the pages' forms refuse (blank titles, documents, values,
questions; "blank" includes zero-width characters alone; NUL characters anywhere): 422 naming the field; pydantic refuses text that is not valid Unicode (a lone
surrogate such as "\ud800" in JSON) the same way, and `app.api.handlers` quotes it back safely.
Ids in bodies are bounded by 2^53 - 1 (what a JSON number carries exactly; the database's integers
go further). The OpenAPI schema states every limit as the validators apply it: lengths and the
models offered as settings say when the schema is made, text patterns (visible, no NUL), strict
booleans. Every timestamp goes out in UTC
with its timezone (SQLite hands them back naive).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictBool,
    StringConstraints,
    field_validator,
)

from data.contracts import NotesMap, RunSnapshot, StrategyMetrics, TokenRecord, unix_newlines
from data.settings import Settings, get_settings
from vocabulary import STRATEGIES, unknown_strategies, with_recompute

MAX_DB_ID = 2**53 - 1  # ids in bodies: the largest integer a JSON number (a double) carries exactly


@dataclass(frozen=True)
class Documented:
    """Adds `describe()` to a field's JSON schema when the schema is made, so the OpenAPI schema
    states a limit read from settings (as the validators read it), a model list or a pattern."""

    describe: Callable[[], dict[str, Any]]

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = handler(core_schema)
        schema.update(self.describe())
        return schema


def _invisible_class() -> str:
    """A regex character class body of every character `_visible` does not count: whitespace and
    format characters (zero-width space, BOM, …), and NUL."""
    codes = [c for c in range(sys.maxunicode + 1)
             if c == 0 or chr(c).isspace() or unicodedata.category(chr(c)) == "Cf"]
    ranges, first = [], codes[0]
    for previous, code in zip(codes, [*codes[1:], None], strict=True):
        if code != previous + 1:
            ranges.append((first, previous))
            first = code
    def char(c: int) -> str:
        return f"\\u{c:04x}" if c <= 0xFFFF else chr(c)
    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


# text that shows something (`_not_blank`) and holds no NUL (`_no_nul`), as the schema says it
VISIBLE_TEXT = f"^[^\\x00]*[^{_invisible_class()}][^\\x00]*$"
ANY_TEXT = "^[^\\x00]*$"


def _visible(value: str) -> bool:
    """Has `value` a character that shows (not whitespace, not a zero-width or other format character)?"""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in value)


def _not_blank(value: str) -> str:
    if not _visible(value):
        raise ValueError("cannot be blank")
    return value


def _no_nul(value: str) -> str:
    """PostgreSQL cannot store NUL in text, and no document needs it: refused like the forms refuse it."""
    if "\x00" in value:
        raise ValueError(f"cannot contain a NUL character (\\x00, at {value.index(chr(0))})")
    return value


def at_most(setting: str, key: str = "maxLength") -> tuple[AfterValidator, Documented]:
    """A length limit read from settings when a request is validated (never once at import): the
    field's characters, or a list's items (`key="maxItems"`), at most `Settings.<setting>`, named by
    its variable in the message; the schema states the same limit."""
    variable = Settings.model_fields[setting].validation_alias

    def check(value: str | list) -> str | list:
        limit = getattr(get_settings(), setting)
        if len(value) > limit:
            unit = "characters" if isinstance(value, str) else "items"
            raise ValueError(f"at most {limit} {unit} ({variable}); got {len(value)}")
        return value

    return AfterValidator(check), Documented(lambda: {key: getattr(get_settings(), setting)})


def _within_document(offset: int) -> int:
    limit = get_settings().max_document_chars
    if offset > limit:
        raise ValueError(f"at most {limit} (KVNOTES_MAX_DOCUMENT_CHARS); got {offset}")
    return offset


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _text(setting: str, *more: AfterValidator, blank: bool = False) -> Any:
    """A text field: its limit (per call), no NUL, not blank unless `blank`, then `more`."""
    pattern = Documented(lambda: {"pattern": ANY_TEXT if blank else VISIBLE_TEXT})
    checks = [*at_most(setting), AfterValidator(_no_nul), *([] if blank else [NotBlank]), pattern, *more]
    return Annotated[(str, StringConstraints(min_length=0 if blank else 1), *checks)]


NotBlank = AfterValidator(_not_blank)
Timestamp = Annotated[datetime, AfterValidator(_utc)]
DbId = Annotated[int, Field(ge=1, le=MAX_DB_ID)]
Title = _text("max_title_chars")


def _served(name: str) -> str:
    """A notebook or skill may only name a model some worker serves (`KVNOTES_MODELS`): a run for
    any other would wait in a queue no worker reads."""
    offered = get_settings().models
    if name not in offered:
        raise ValueError(f"model {name!r} is not served here; choose one of {', '.join(offered)} (KVNOTES_MODELS)")
    return name


ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_served),
                      Documented(lambda: {"enum": get_settings().models})]
DocumentText = _text("max_document_chars", AfterValidator(unix_newlines))
Label = _text("max_label_chars", blank=True)
Value = _text("max_value_chars")
ErratumText = _text("max_erratum_chars", AfterValidator(unix_newlines))
SkillText = _text("max_skill_chars", AfterValidator(unix_newlines))
SkillName = _text("max_label_chars")
QuestionText = _text("max_question_chars")
Choice = _text("max_label_chars")
Choices = Annotated[list[Choice], *at_most("max_choices", "maxItems")]
Offset = Annotated[int, Field(ge=0, le=MAX_DB_ID), AfterValidator(_within_document),
                   Documented(lambda: {"maximum": get_settings().max_document_chars})]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# --- notebooks -----------------------------------------------------------------------------------


class NotebookCreate(BaseModel):
    title: Title = "Untitled"
    model: ModelName = Field(default_factory=lambda: get_settings().default_model)
    text: DocumentText


class NotebookPatch(BaseModel):
    title: Title | None = None
    model: ModelName | None = None
    text: DocumentText | None = None


class NotebookSummary(_Out):
    id: int
    title: str
    model: str
    created_by: str | None = None
    created_at: Timestamp
    updated_at: Timestamp


# --- fields and errata ---------------------------------------------------------------------------


class FieldCreate(BaseModel):
    start: Offset
    end: Offset
    new_value: Value
    label: Label = ""


class FieldPatch(BaseModel):
    start: Offset | None = None
    end: Offset | None = None
    new_value: Value | None = None
    label: Label | None = None


class FieldOut(_Out):
    id: int
    notebook_id: int
    start: int
    end: int
    old_value: str
    new_value: str
    label: str
    created_at: Timestamp


class ErratumCreate(BaseModel):
    text: ErratumText


class ErratumPatch(BaseModel):
    text: ErratumText


class ErrataOrder(BaseModel):
    ids: Annotated[list[DbId], *at_most("max_errata", "maxItems")]


class ErratumOut(_Out):
    id: int
    notebook_id: int
    field_id: int | None
    text: str
    source: Literal["generated", "custom"]
    position: int


# --- skills and placements -----------------------------------------------------------------------


class SkillCreate(BaseModel):
    name: SkillName
    text: SkillText
    model: ModelName = Field(default_factory=lambda: get_settings().default_model)


class SkillPatch(BaseModel):
    name: SkillName | None = None
    text: SkillText | None = None
    model: ModelName | None = None


class SkillOut(_Out):
    id: int
    name: str
    text: str
    model: str
    status: Literal["draft", "compiling", "compiled", "failed"]
    token_count: int | None
    store_key: str | None
    compile_ms: float | None
    error: str | None
    progress: float
    created_by: str | None = None
    created_at: Timestamp
    updated_at: Timestamp


class PlacementCreate(BaseModel):
    skill_id: DbId
    position: Offset | None = None


class PlacementPatch(BaseModel):
    position: Offset | None


class PlacementOut(_Out):
    id: int
    notebook_id: int
    skill_id: int
    skill_name: str
    position: int | None


# --- questions -----------------------------------------------------------------------------------


class QuestionIn(BaseModel):
    text: QuestionText
    choices: Choices = []
    cot: StrictBool = False


class QuestionOut(_Out):
    id: int
    text: str
    choices: list[str]
    cot: bool
    created_at: Timestamp


class NotebookOut(NotebookSummary):
    text: str
    fields: list[FieldOut]
    errata: list[ErratumOut]
    placements: list[PlacementOut]
    question: QuestionOut | None


# --- runs ----------------------------------------------------------------------------------------


class RunCreate(BaseModel):
    """Start a run. Without `question` the notebook's current question is used; with one, it
    becomes the notebook's current question. `recompute` (the oracle) is always included."""

    question: QuestionText | None = None
    choices: Choices | None = None
    cot: StrictBool | None = None
    strategies: Annotated[list[Annotated[str, Documented(lambda: {"enum": list(STRATEGIES)})]],
                          Field(max_length=len(STRATEGIES))] = list(STRATEGIES)
    attribution: StrictBool = False  # also compute the notes map: which notes carry the decision

    @field_validator("strategies")
    @classmethod
    def _known_strategies(cls, value: list[str]) -> list[str]:
        problem = unknown_strategies(value)
        if problem:
            raise ValueError(problem)
        return with_recompute(value)


class StrategyResultOut(StrategyMetrics):
    """One strategy's metrics (`vocabulary.METRICS`) and the shape of its attention."""

    model_config = ConfigDict(from_attributes=True)

    attention_shape: list[int] | None = None


class RunOut(BaseModel):
    id: int
    notebook_id: int | None
    kind: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    stage: str
    progress: float
    error: str | None
    worker: str | None
    task_id: str | None
    strategies: list[str]
    created_by: str | None = None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    heartbeat_at: Timestamp | None
    timings: dict[str, float]
    snapshot: RunSnapshot
    results: dict[str, StrategyResultOut]
    attribution: NotesMap | None = None
    # the decision's attention by region, mean over layers and heads: {strategy: {region: share}}
    # (`vocabulary.regions.REGIONS`, each summing to 1); filled by GET /runs/{id} only
    attention_regions: dict[str, dict[str, float]] = {}


class RunSummary(_Out):
    id: int
    notebook_id: int | None
    status: str
    stage: str
    progress: float
    strategies: list[str]
    created_by: str | None = None
    created_at: Timestamp
    finished_at: Timestamp | None


class AttentionOut(BaseModel):
    """Where one token (`query`; the decision by default) looked over the T tokens: for the decision
    one layer and head, or aggregated; for any other question or answer token, the mean over all."""

    run_id: int
    strategy: str
    layer: int | None
    head: int | None
    agg: Literal["mean", "max"] | None
    shape: list[int]
    query: int
    decision: int
    query_start: int | None  # tokens[query_start:] are the question and answer tokens
    tokens: list[TokenRecord]
    values: list[float]


class HealthOut(BaseModel):
    """Each part "ok" or one line saying what is down."""

    status: Literal["ok", "degraded"]
    database: str
    broker: str
    workers: str


class ErrorOut(BaseModel):
    """A 404, 409 or 503: one line a person can act on."""

    detail: str
