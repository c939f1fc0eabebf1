"""The database schema as a typed SQLAlchemy 2 ORM: what a user makes (notebooks, fields, errata,
skills, placements, questions) and what a run produced (runs, run results).

The database is the source of truth; the broker carries only ids. A run keeps a `snapshot` of
exactly what it ran on, so editing the notebook afterwards never changes an old result; deleting a
notebook deletes its runs too (a deleted document must not stay readable in their snapshots).
Notebooks, skills and runs record who made them (`created_by`: a user name, or "local" on the
embedded default); users, tokens and share links are in `data.accounts`, workers in `data.workers`.
Attention maps are stored compactly: float16 bytes `[layers, heads, T]` in a blob column, never JSON
floats. Ids are never reused (`NEVER_REUSE_IDS`, migration 0006), and a run's status is a `RunStatus`.
The web app and the worker import these models; nothing here imports either. JSON columns that
cross the web ↔ worker boundary hold typed values (`data.contracts`), never loose dicts.
Longer than 400 lines because it holds the notebook's and the runs' tables in one place. The other
concerns keep their tables beside their code (accounts, sign-in, workers, replays, trajectories,
the health probe; see docs/architecture.md); all share one `Base`, so Alembic sees one schema.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    select,
)
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, validates
from sqlalchemy.sql import Select
from sqlalchemy.types import TypeDecorator

from data.contracts import (
    FieldPolicy,
    MechanismRecord,
    NotesMap,
    RunSnapshot,
    SnapshotQuestion,
    StoreReuse,
    SweepEdit,
    TokenRecord,
)


class RunStatus(StrEnum):
    """Where a run is; stored as these strings (the `runs.status` check constraint lists them)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUN_STATUSES = tuple(status.value for status in RunStatus)
RUN_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING)
RUN_FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
# `runs.error` of a run the reaper (`data.watchdog`) failed because its worker or its message was
# lost (a sweep's edit is queued again once instead, by the reaper: `data.watchdog.lose`)
WORKER_LOST = "worker lost while running; re-run it"
MESSAGE_LOST = "its queue message was lost with a stopped worker before it started; re-run it"
# Ids are never reused (SQLite AUTOINCREMENT; PostgreSQL sequences never go back): an old address
# either shows what it showed or says it was deleted, never another user's notebook or run.
NEVER_REUSE_IDS = {"sqlite_autoincrement": True}
SKILL_STATUSES = ("draft", "compiling", "compiled", "failed")
ERRATUM_SOURCES = ("generated", "custom")

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def db_now(session: Session) -> datetime:
    """The database's clock, in UTC (PostgreSQL's `now()`, SQLite's `'now'`): what the job heartbeats,
    the workers' beats and the reaper read and write (issue 49), so that no two hosts' clocks are
    compared. On PostgreSQL it is the transaction's start: call it first in a short transaction."""
    if session.get_bind().dialect.name == "sqlite":
        moment = session.scalar(sql_text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"))
        return datetime.fromisoformat(moment).replace(tzinfo=UTC)
    return as_utc(session.scalar(select(func.now()))).astimezone(UTC)


def new_task_id() -> str:
    """A fresh queue-message token (a Celery task id)."""
    return str(uuid.uuid4())


def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time we store is UTC, so say so."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


class Typed(TypeDecorator):
    """A JSON column that holds a pydantic value (a model, or a list of them): dumped to JSON on the
    way in, validated back into the typed value on the way out."""

    impl = JSON
    cache_ok = True

    def __init__(self, annotation: Any) -> None:
        super().__init__()
        self.annotation = annotation
        self._adapter = TypeAdapter(annotation)

    def coerce(self, value: Any) -> Any:
        """The typed value of `value` (a dict or list of dicts is validated; a model passes)."""
        return None if value is None else self._adapter.validate_python(value)

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else self._adapter.dump_python(self.coerce(value), mode="json")

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else self._adapter.validate_python(value)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Notebook(Base):
    """A document to edit. `example` names the bundled example it was loaded from (loading that
    example again offers this notebook); the (updated_at, id) index serves the paginated home page."""

    __tablename__ = "notebooks"
    __table_args__ = (Index("ix_notebooks_updated_at_id", "updated_at", "id"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200))
    document: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(64))
    example: Mapped[str | None] = mapped_column(String(64), index=True)
    # the policy adopted from a finished sweep (`app.services.notebooks.adopt_policy`): auto applies it
    policy_strategy: Mapped[str | None] = mapped_column(String(64))
    policy_sweep_id: Mapped[int | None] = mapped_column(Integer)  # no key: the policy outlives its sweep
    policy_threshold: Mapped[float | None] = mapped_column(Float)
    policy_sentence: Mapped[str | None] = mapped_column(Text)
    # per field, when adopted from a sweep that edited fields separately (migration 0016); the
    # overall `policy_strategy` applies to a field none of them names
    policy_fields: Mapped[list[FieldPolicy] | None] = mapped_column(Typed(list[FieldPolicy]))

    fields: Mapped[list[Field]] = relationship(
        back_populates="notebook", cascade="all, delete-orphan", passive_deletes=True, order_by="Field.start"
    )
    errata: Mapped[list[Erratum]] = relationship(
        back_populates="notebook",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="(Erratum.position, Erratum.id)",
    )
    placements: Mapped[list[Placement]] = relationship(
        back_populates="notebook", cascade="all, delete-orphan", passive_deletes=True, order_by="Placement.id"
    )
    questions: Mapped[list[Question]] = relationship(
        back_populates="notebook", cascade="all, delete-orphan", passive_deletes=True, order_by="Question.id"
    )

    @property
    def question(self) -> Question | None:
        """The notebook's current question: its latest."""
        return self.questions[-1] if self.questions else None


class Field(Base):
    """A character span [start, end) of the document, its old value and the value it now holds."""

    __tablename__ = "fields"
    __table_args__ = (CheckConstraint('start >= 0 AND start < "end"', name="span"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"), index=True)
    start: Mapped[int] = mapped_column(Integer)
    end: Mapped[int] = mapped_column(Integer)
    old_value: Mapped[str] = mapped_column(Text)
    new_value: Mapped[str] = mapped_column(Text)
    label: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    notebook: Mapped[Notebook] = relationship(back_populates="fields")


class Erratum(Base):
    """A correction appended after the document: generated from a field, or written by hand.
    A generated erratum edited by hand becomes `custom` and is no longer re-rendered."""

    __tablename__ = "errata"
    __table_args__ = (CheckConstraint(_one_of("source", ERRATUM_SOURCES), name="source"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"), index=True)
    field_id: Mapped[int | None] = mapped_column(ForeignKey("fields.id", ondelete="SET NULL"), index=True)
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16), default="custom")
    position: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    notebook: Mapped[Notebook] = relationship(back_populates="errata")


class Skill(Base):
    """A text compiled once into notes (KV) that can be spliced into any notebook."""

    __tablename__ = "skills"
    __table_args__ = (CheckConstraint(_one_of("status", SKILL_STATUSES), name="status"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)
    model: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="draft")
    token_count: Mapped[int | None] = mapped_column(Integer)
    store_key: Mapped[str | None] = mapped_column(String(200))
    compile_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    task_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(64))


class Placement(Base):
    """A skill spliced into a notebook at a character offset of the document (NULL: at the end)."""

    __tablename__ = "placements"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"), index=True)
    skill_id: Mapped[int] = mapped_column(ForeignKey("skills.id", ondelete="CASCADE"), index=True)
    position: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    notebook: Mapped[Notebook] = relationship(back_populates="placements")
    skill: Mapped[Skill] = relationship()

    @property
    def skill_name(self) -> str:
        return self.skill.name


class Question(Base):
    """The readout asked after the document; a notebook's current question is its latest."""

    __tablename__ = "questions"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    choices: Mapped[list[str]] = mapped_column(JSON, default=list)
    cot: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    notebook: Mapped[Notebook] = relationship(back_populates="questions")


class Run(Base):
    """One request to the worker. `snapshot` is exactly what was run (a `RunSnapshot`, written by
    the web and read by the worker); deleting the notebook deletes the run."""

    __tablename__ = "runs"
    __table_args__ = (CheckConstraint(_one_of("status", RUN_STATUSES), name="status"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int | None] = mapped_column(
        ForeignKey("notebooks.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16), default="edit")
    snapshot: Mapped[RunSnapshot] = mapped_column(Typed(RunSnapshot))
    strategies: Mapped[list[str]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED.value, index=True)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(200))
    # the token its queue message carries (the Celery task id, set before the row is committed): a
    # message whose token is not its run's is never run (`worker.run_rows.claim`)
    task_id: Mapped[str | None] = mapped_column(String(64), default=new_task_id)
    created_by: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    timings: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    # what the run computed in and where (the engine's report): "bfloat16", "cuda:0"; None until it ran
    dtype: Mapped[str | None] = mapped_column(String(16))
    device: Mapped[str | None] = mapped_column(String(64))
    # which notes carry the decision (asked for with the snapshot's `attribution`); None otherwise
    attribution: Mapped[NotesMap | None] = mapped_column(Typed(NotesMap))
    # knockout, selective@K and the logit lens (asked for with the snapshot's `mechanism`); None otherwise
    mechanism: Mapped[MechanismRecord | None] = mapped_column(Typed(MechanismRecord))
    # how many document tokens came from the KV store, from which tier (issue 40); None until it ran
    store_reuse: Mapped[StoreReuse | None] = mapped_column(Typed(StoreReuse))
    # an edit of a sweep: the sweep, what the edit sets, and how many times a worker took it
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    sweep_edit: Mapped[SweepEdit | None] = mapped_column(Typed(SweepEdit))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    results: Mapped[list[RunResult]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="RunResult.id"
    )

    @validates("snapshot")
    def _typed_snapshot(self, _key: str, value: Any) -> RunSnapshot:
        return RunSnapshot.model_validate(value)

    @validates("mechanism")
    def _typed_mechanism(self, _key: str, value: Any) -> MechanismRecord | None:
        return None if value is None else MechanismRecord.model_validate(value)

    @validates("attribution")
    def _typed_notes_map(self, _key: str, value: Any) -> NotesMap | None:
        return None if value is None else NotesMap.model_validate(value)

    @property
    def is_finished(self) -> bool:
        return self.status in RUN_FINISHED

    @property
    def model(self) -> str:
        return self.snapshot.model

    @property
    def is_sweep_edit(self) -> bool:
        """One edit of a sweep (the sweep's, not something run on the notebook by hand)."""
        return self.sweep_id is not None


def notebook_runs(notebook_id: int | None, sweeps: bool = False) -> Select:
    """SQL: a notebook's runs, newest first: its own (run on it by hand or by the API), and with
    `sweeps` its sweeps' edits too. A sweep's edits are the sweep's: they never make the notebook's
    history, its latest run or the run a new one is compared with, unless asked for."""
    query = select(Run).where(Run.notebook_id == notebook_id)
    if not sweeps:
        query = query.where(Run.sweep_id.is_(None))
    return query.order_by(Run.id.desc())


class Sweep(Base):
    """Many edits of one notebook's fields, each an ordinary run (`runs.sweep_id`), asked one
    question with the same strategies; its statistics are computed from those runs when shown
    (`app.services.sweeps`). `mode` is "values" (each field swept separately) or "edits" (rows)."""

    __tablename__ = "sweeps"
    __table_args__ = (CheckConstraint(_one_of("status", RUN_STATUSES), name="status"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int | None] = mapped_column(
        ForeignKey("notebooks.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(200))
    question: Mapped[SnapshotQuestion] = mapped_column(Typed(SnapshotQuestion))
    strategies: Mapped[list[str]] = mapped_column(JSON)
    threshold: Mapped[float] = mapped_column(Float, default=0.95)
    mode: Mapped[str] = mapped_column(String(16), default="values")
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED.value, index=True)
    edits_total: Mapped[int] = mapped_column(Integer, default=0)
    edits_done: Mapped[int] = mapped_column(Integer, default=0)
    edits_skipped: Mapped[int] = mapped_column(Integer, default=0)  # a value equal to the old one
    document_prefills: Mapped[int] = mapped_column(Integer, default=0)  # once per sweep and worker
    # stop as soon as the policy cannot change (`vocabulary.sweeps.Policy.decided`): the rest cancelled
    stop_when_decided: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    stopped: Mapped[str | None] = mapped_column(String(16))  # decided | exhausted | cancelled (null: running)
    extended_choices: Mapped[list[str] | None] = mapped_column(JSON)  # values added to the choices
    error: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    runs: Mapped[list[Run]] = relationship(passive_deletes=True, order_by="Run.id")

    @validates("question")
    def _typed_question(self, _key: str, value: Any) -> SnapshotQuestion:
        return SnapshotQuestion.model_validate(value)


class RunResult(Base):
    """One strategy's decision and fidelity against `recompute` (the engine's JSON names), its
    generated text, and the decision's attention over the cached tokens."""

    __tablename__ = "run_results"
    __table_args__ = (UniqueConstraint("run_id", "strategy"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    strategy: Mapped[str] = mapped_column(String(32))
    decision: Mapped[str] = mapped_column(Text, default="")
    choice_probs: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    kl_to_recompute: Mapped[float] = mapped_column(Float, default=0.0)
    top1_agrees: Mapped[bool] = mapped_column(Boolean, default=True)
    topk_overlap: Mapped[int] = mapped_column(Integer, default=0)
    logit_cosine: Mapped[float] = mapped_column(Float, default=1.0)
    decision_matches_recompute: Mapped[bool] = mapped_column(Boolean, default=True)
    tokens_computed: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    text: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[str] = mapped_column(Text, default="")
    answer_f1: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    recompute_answer_nll: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    decode_ms: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    prefix_cache_share: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    picked: Mapped[str | None] = mapped_column(String(32))  # the strategy auto picked; None for others
    # [min, max] time to first token over the interleaved repeats (ttft_ms is their median)
    ttft_spread_ms: Mapped[list[float]] = mapped_column(JSON, default=list)
    edit_followed: Mapped[str | None] = mapped_column(String(16))  # "new" | "old" | "both" | "neither"
    # the speed-up over recompute: median and [min, max] over the paired timing rounds (revision 0012)
    speedup: Mapped[float | None] = mapped_column(Float)
    speedup_range: Mapped[list[float]] = mapped_column(JSON, default=list)
    # each choice's [min, max] probability over the cyclic orders of the choices, and the position
    # the answer follows more than the document ("first", "last", …; None when it follows the document)
    choice_spread: Mapped[dict[str, list[float]]] = mapped_column(JSON, default=dict)
    order_bias: Mapped[str | None] = mapped_column(String(16))
    # reading the choices over their other orders, timed apart from the first token (revision 0019)
    measure_ms: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # the orders of the choices the decision read, of those a full reading reads (revision 0021):
    # fewer is a partial reading, stopped once settled; 0 and 0 for a free answer and older rows
    orders_read: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    orders_total: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # float16 bytes, C order, shape `attention_shape` = [layers, heads, T]; loaded only when asked for.
    attention: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    attention_shape: Mapped[list[int] | None] = mapped_column(JSON)
    # the T tokens the attention looks at: the notes, then the question, then the answer
    tokens: Mapped[list[TokenRecord] | None] = mapped_column(Typed(list[TokenRecord]))
    # index in `tokens` of the decision position (the question's last token)
    decision_index: Mapped[int | None] = mapped_column(Integer)
    # float16 bytes [T - query_start, T]: where each question and answer token looked, averaged
    # over layers and heads (the decision's own per-layer, per-head map is `attention`)
    query_attention: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    query_start: Mapped[int | None] = mapped_column(Integer)

    run: Mapped[Run] = relationship(back_populates="results")

    @validates("tokens")
    def _typed_tokens(self, _key: str, value: Any) -> list[TokenRecord] | None:
        return None if value is None else [TokenRecord.model_validate(t) for t in value]
