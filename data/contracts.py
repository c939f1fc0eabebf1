"""Typed values that cross a process boundary: what the web hands the worker (the run snapshot),
what the worker hands back (a strategy's metrics, the tokens its attention looks at), and the
documents both read.

Pydantic models, stored as JSON columns (`data.models` converts on the way in and out), so the web
writes and the worker reads one class, never a dict indexed by key. No torch, no FastAPI here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from vocabulary import METRICS


def unix_newlines(text: str) -> str:
    """Documents are stored with `\\n` line ends (what browsers draw and select over; textareas
    submit CRLF), so field offsets mean the same thing to the API, the pages and the engine."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


# ---- web → worker: exactly what a run runs on ---------------------------------------------------


class SnapshotField(_Frozen):
    """A field as it was when the run started: document span [start, end), old and new value."""

    start: int
    end: int
    old: str
    new: str
    label: str


class SnapshotPlacement(_Frozen):
    """A skill placed at a document offset (None: after the document). `skill_id` lets the worker
    reuse the skill's compiled notes when its text is still the same."""

    skill_id: int | None
    name: str
    text: str
    position: int | None


class SnapshotQuestion(_Frozen):
    text: str
    choices: list[str]
    cot: bool


class RunSnapshot(_Frozen):
    """Exactly what a run ran on; `runs.snapshot`. Editing or deleting the notebook later never
    changes it."""

    model: str
    document: str
    fields: list[SnapshotField]
    errata: list[str]
    placements: list[SnapshotPlacement]
    question: SnapshotQuestion
    strategies: list[str]
    attribution: bool = False  # also map which notes carry the decision (costs a few recomputes)
    mechanism: bool = False  # also knockout, selective@K and the logit lens (`runs.mechanism`)
    # the sweep this run is an edit of: its workers share the document's notes (prefilled once each)
    sweep_id: int | None = None
    # the strategy the notebook adopted from a sweep's policy: `auto` runs only it (None: oracle pick)
    policy: str | None = None
    # why that strategy: which field(s) the run edits and whose policy applied (per-field policies)
    policy_note: str | None = None
    # time the strategies in paired rounds; False: a sweep's edit past its timed sample decides only
    # (every strategy once, untimed, the reference computed exactly from the field on)
    timed: bool = True
    # who started the run (`runs.created_by`): with KVNOTES_STORE_SCOPE=user the worker keys the KV
    # store's notes by it, so one user's run never reads (nor times) what another prefilled
    user: str | None = None


class FieldPolicy(_Frozen):
    """One field's policy, adopted from a sweep that edited its fields separately
    (`notebooks.policy_fields`): the strategy `auto` applies to a run that edits this field, the
    threshold it was read at, its sentence, and the share of recompute's tokens the strategy
    computed on that field's edits (which ranks strategies when a run edits several fields)."""

    field: str
    strategy: str
    threshold: float
    sentence: str
    cost_share: float | None = None


class SweepEdit(_Frozen):
    """One edit of a sweep (`runs.sweep_edit`): its place in the sweep, the field it varies when
    fields are swept separately ("" when the edit sets several together), the values it sets by
    field label, and the answer a person expects (None: not scored)."""

    position: int
    group: str = ""
    values: dict[str, str]
    expected: str | None = None


# ---- worker → web: what a run produced ------------------------------------------------------------


class TokenRecord(_Frozen):
    """A cached token as the pages draw it: its id, text, character span in the document
    ((-1, -1) when it is not document text) and segment: frame | document | skill | erratum |
    question | sink."""

    id: int
    text: str
    start: int
    end: int
    segment: str

    @property
    def in_document(self) -> bool:
        return self.segment == "document" and self.start >= 0


class NotesSpan(_Frozen):
    """A span of downstream notes and the share of the stale → recompute decision gap that patching
    it from recompute closes. Character offsets into the snapshot's document."""

    start_char: int
    end_char: int
    text: str
    share: float


class EditSpan(_Frozen):
    """One changed stretch of the document (a field, or fields too close to tell apart) and the
    share of the stale → recompute gap that refreshing it alone closes. Offsets into the document."""

    start_char: int
    end_char: int
    share: float


class NotesMap(_Frozen):
    """Which notes carry the decision: the field's own share of the gap, each downstream span's,
    each changed stretch's own (several fields), and the KL gap itself (stale vs in_place against
    recompute). Every share is that patch alone: they do not add up."""

    field_share: float
    kl_stale: float
    kl_in_place: float
    spans: list[NotesSpan]
    edits: list[EditSpan] = []


class MechReading(_Frozen):
    """The decision at the first answer token under some notes, p(recompute's answer token) there
    and KL(recompute ‖ these notes)."""

    decision: str
    p_answer: float
    kl: float


class MechControl(_Frozen):
    """A random set of the same size knocked out instead: mean and standard deviation over the
    draws, and the share of draws that keep recompute's decision."""

    size: int
    draws: int
    p_answer: float
    p_answer_spread: float
    kl: float
    kl_spread: float
    agreement: float


class KnockoutRow(_Frozen):
    """One region masked at the decision token in `layers` (all, early, middle, late) for one
    strategy's notes; reading and control None when the region is empty (`note` says so)."""

    strategy: str
    region: str
    layers: str
    size: int
    reading: MechReading | None = None
    control: MechControl | None = None
    agrees: bool | None = None
    note: str = ""


class KPoint(_Frozen):
    k: int
    reading: MechReading
    agrees: bool


class KCurve(_Frozen):
    """Selective@K under one ranking, and K* (None: no K restores recompute's decision for good)."""

    ranking: str
    points: list[KPoint]
    k_star: int | None
    note: str = ""


class StoreReuse(_Frozen):
    """How many of a run's document tokens its notes were read from the KV store, and from which
    tier (`runs.store_reuse`, issue 40): "local" (this worker's folder), "shared" (the S3 tier, another
    worker's notes) or "none"; `shared_tier` names a fault of the shared tier that made it a miss
    ("unreachable", "missing bucket", "damaged"; "" when none)."""

    tokens: int
    tier: Literal["local", "shared", "none"]
    shared_tier: str = ""


class MechanismRecord(_Frozen):
    """Why a decision moved, causally (`runs.mechanism`, asked for with the snapshot's `mechanism`):
    knockout rows with their controls, selective@K curves per ranking, the logit lens per strategy
    (p of recompute's answer token at every layer), each view's cost in recomputes, and lines for
    what could not be measured."""

    answer: str
    decision: str
    shown: str | None
    unmasked: dict[str, MechReading] = {}
    knockout: list[KnockoutRow] = []
    downstream: int = 0
    selective_k: list[KCurve] = []
    selective_skipped: str = ""  # why the selective@K sweep did not run (in_place already agrees)
    logit_lens: dict[str, list[float]] = {}
    costs: dict[str, float] = {}
    notes: list[str] = []
    read_at: str = ""  # which answer token the views read, and why there (issue 43; "" before it)
    # each strategy's own answer token where it was read, and where and why (issue 51; {} before it)
    answer_by: dict[str, str] = {}
    read_at_by: dict[str, str] = {}


def _metric_fields() -> dict[str, Any]:
    return {metric.name: (metric.type, ...) for metric in METRICS}


# One strategy's metrics against recompute: the fields are `vocabulary.METRICS`, built from it.
StrategyMetrics = create_model(
    "StrategyMetrics",
    __base__=BaseModel,
    __doc__="One strategy's decision and fidelity against recompute (`vocabulary.METRICS`).",
    **_metric_fields(),
)
