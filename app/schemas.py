"""Pydantic models of the HTTP JSON API: what a client may send (with its limits) and what it gets.

The field types (text with its limit and rules, ids, offsets, models, timestamps) live in
`app.schema_types`: limits are read from settings per request and stated in the OpenAPI schema.
Run results use the engine's JSON names (`kvnotes edit --json`): decision, choice_probs,
kl_to_recompute, ... The run snapshot and the token records are the data layer's contracts
(`data.contracts`).

Every text of every request model keeps the one set of text rules (`vocabulary.text_rules`, as the
types of `app.schema_types`): valid Unicode (no lone surrogate such as "\ud800" in JSON), no NUL,
not blank ("blank" includes zero-width characters, marks and fillers alone), at most its limit: 422
naming the field, quoted back safely by `app.api.handlers`; the pages' forms validate with the same
models (tests/api/test_text_rules.py walks the OpenAPI schema to hold every string to them).
Booleans are strict (0 is not false).
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
    Integer,
    Label,
    ModelName,
    Number,
    Offset,
    QuestionText,
    ServedModelName,
    ServerUrl,
    SkillName,
    SkillText,
    StrategyName,
    Timestamp,
    Title,
    Value,
    at_most,
)
from data.contracts import (
    FieldPolicy,
    MechanismRecord,
    NotesMap,
    RunSnapshot,
    StoreReuse,
    StrategyMetrics,
    TokenRecord,
)
from data.models import RunStatus
from data.replays import Replay
from data.settings import get_settings
from vocabulary import STRATEGIES, unknown_strategies, with_recompute
from vocabulary.replay import (
    VARIANTS,
    ReplayResult,
    ReplaySpec,
    TrajectoryReplayResult,
    TrajectoryReplaySpec,
)


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
    # the policy adopted from a finished sweep (`POST /api/sweeps/{id}/adopt`): `auto` runs only it
    policy_strategy: str | None = None
    policy_sweep_id: int | None = None
    policy_threshold: float | None = None
    policy_sentence: str | None = None
    # per field, when adopted with `per_field=true`: `auto` runs the strategy of the field(s) a run edits
    policy_fields: list[FieldPolicy] | None = None


# --- runs ----------------------------------------------------------------------------------------


class RunCreate(BaseModel):
    """Start a run. Without `question` the notebook's current question is used; with one, it
    becomes the notebook's current question. `recompute` (the oracle) is always included."""

    question: QuestionText | None = None
    choices: Choices | None = None
    cot: StrictBool | None = None
    strategies: Annotated[list[Annotated[StrategyName, Documented(lambda: {"enum": list(STRATEGIES)})]],
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
    # the document's tokens read from the KV store and the tier ("local" | "shared" | "none"; issue 40)
    store_reuse: StoreReuse | None = None
    # the decision's attention by region, mean over layers and heads: {strategy: {region: share}}
    # (`vocabulary.regions.REGIONS`, each summing to 1); filled by GET /runs/{id} only
    attention_regions: dict[str, dict[str, float]] = {}


class RunSummary(_Out):
    id: int
    notebook_id: int | None
    sweep_id: int | None = None  # set on a sweep's edit (listed only with ?sweeps=true)
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


# --- serving replays -----------------------------------------------------------------------------

MAX_REPLAY_VALUES = 64
MAX_REPLAY_REQUESTS = 256


class ReplayCreate(BaseModel):
    """A replay of the notebook's field edit on a vLLM server. Unset: the server of `KVNOTES_VLLM_URL`
    (and `KVNOTES_VLLM_MODEL`), the notebook's first field, its new value as the only value."""

    model_config = ConfigDict(extra="forbid")

    url: ServerUrl = Field(default="", description="the server, e.g. http://127.0.0.1:8100/v1")
    model: ServedModelName = Field(default="", description="the served model ('' = the one it serves)")
    field_id: Integer | None = Field(default=None, description="the field that changes (default: the first)")
    values: list[Value] = Field(default_factory=list, max_length=MAX_REPLAY_VALUES,
                                description="the values the field takes, one per request, in turn")
    requests: Integer = Field(default=0, ge=0, le=MAX_REPLAY_REQUESTS,
                              description="per variant (0: one per value)")
    rate: Number = Field(default=1.0, gt=0, le=1000, description="Poisson arrivals, requests per second")
    concurrency: Integer = Field(default=4, ge=1, le=64, description="requests in flight at most")
    variants: list[StrategyName] = Field(default_factory=lambda: list(VARIANTS), min_length=1,
                                         max_length=len(VARIANTS))
    max_tokens: Integer = Field(default=16, ge=1, le=256, description="answer tokens per request")
    extend_choices: StrictBool = Field(default=False, description="values outside the question's choices are "
                                 "added to the choices this replay sends (else such values are refused)")


class TrajectoryReplayCreate(BaseModel):
    """A replay of a trajectory on a vLLM server: one chat request per turn, in order, per variant.
    Unset: the server of `KVNOTES_VLLM_URL` (and `KVNOTES_VLLM_MODEL`), every variant."""

    model_config = ConfigDict(extra="forbid")

    url: ServerUrl = Field(default="", description="the server, e.g. http://127.0.0.1:8100/v1")
    model: ServedModelName = Field(default="", description="the served model ('' = the one it serves)")
    variants: list[StrategyName] = Field(default_factory=lambda: list(VARIANTS), min_length=1,
                                         max_length=len(VARIANTS))
    max_tokens: Integer = Field(default=16, ge=1, le=256, description="answer tokens per request")


class ReplayOut(BaseModel):
    """A replay: where it is, what it replays (`vocabulary.replay.ReplaySpec`; for a trajectory,
    `kind` "trajectory" and a `TrajectoryReplaySpec`) and (once it succeeded) what it measured
    (`ReplayResult`; for a trajectory, `TrajectoryReplayResult`: per variant, every turn)."""

    id: int
    kind: Literal["edit", "trajectory"] = "edit"
    notebook_id: int | None
    trajectory_id: int | None = None
    status: str
    stage: str
    progress: float
    error: str | None
    created_by: str | None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    snapshot: ReplaySpec | TrajectoryReplaySpec
    result: ReplayResult | TrajectoryReplayResult | None

    @classmethod
    def of(cls, replay: Replay) -> ReplayOut:
        kind = "edit" if replay.trajectory_id is None else "trajectory"
        return cls(id=replay.id, kind=kind, notebook_id=replay.notebook_id,
                   trajectory_id=replay.trajectory_id, status=replay.status, stage=replay.stage,
                   progress=replay.progress, error=replay.error, created_by=replay.created_by,
                   created_at=replay.created_at, started_at=replay.started_at, finished_at=replay.finished_at,
                   snapshot=replay.snapshot, result=replay.result)


class HealthOut(BaseModel):
    """Each part "ok" or one line saying what is down."""

    status: Literal["ok", "degraded"]
    database: str
    broker: str
    workers: str


class ErrorOut(BaseModel):
    """A 404, 409 or 503: one line a person can act on."""

    detail: str
