"""Pydantic models of the HTTP JSON API: what a client may send (with its limits) and what it gets.

The field types (text with its limit and rules, ids, offsets, models, timestamps) live in
`app.schema_types`: limits are read from settings per request and stated in the OpenAPI schema.
Run results use the engine's JSON names (`kvnotes edit --json`): decision, choice_probs,
kl_to_recompute, ... The run snapshot and the token records are the data layer's contracts
(`data.contracts`).

Every request model refuses what the pages' forms refuse (blank titles, documents, values,
questions; "blank" includes zero-width characters alone; NUL characters anywhere): 422 naming the
field; pydantic refuses text that is not valid Unicode (a lone surrogate such as "\ud800" in JSON)
the same way, and `app.api.handlers` quotes it back safely. Booleans are strict (0 is not false).
Every timestamp goes out in UTC with its timezone (SQLite hands them back naive).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from app.schema_types import (
    Choices,
    DbId,
    Documented,
    DocumentText,
    ErratumText,
    Label,
    ModelName,
    Offset,
    QuestionText,
    SkillName,
    SkillText,
    Timestamp,
    Title,
    Value,
    at_most,
)
from data.contracts import MechanismRecord, NotesMap, RunSnapshot, StrategyMetrics, TokenRecord
from data.models import RunStatus
from data.settings import get_settings
from vocabulary import STRATEGIES, unknown_strategies, with_recompute


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
    mechanism: StrictBool = False  # also knockout, selective@K and the logit lens (a few recomputes)

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
    status: RunStatus
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
    dtype: str | None = None  # what the engine computed in ("float32", "bfloat16"); None until it ran
    device: str | None = None  # where ("cpu", "cuda:0")
    snapshot: RunSnapshot
    results: dict[str, StrategyResultOut]
    attribution: NotesMap | None = None
    mechanism: MechanismRecord | None = None  # knockout, selective@K, logit lens (asked with `mechanism`)
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
