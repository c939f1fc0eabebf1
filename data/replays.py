"""Serving replays: one row per replay a user started from a notebook (the Serving panel or
`POST /api/notebooks/{id}/replays`), what it replays (`ReplaySnapshot`, written by the web and read
by the worker's `kvnotes.replay`), where it is, and what it measured (`vocabulary.replay.ReplayResult`).

A replay that fails keeps its error and no result: nothing half measured is ever shown as a result.
Deleting the notebook deletes its replays (their snapshots hold its document).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import CheckConstraint, DateTime, Float, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column, validates

from data.models import (
    NEVER_REUSE_IDS,
    RUN_FINISHED,
    RUN_STATUSES,
    Base,
    RunStatus,
    Typed,
    new_task_id,
    utcnow,
)
from vocabulary.replay import VARIANTS, ReplayResult


class ReplaySnapshot(BaseModel):
    """Exactly what a replay sends: the server, the document and its field [start, end), the values
    the field takes in turn, the question, and the load."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    model: str = ""  # "" = the one model the server serves
    document: str
    start: int
    end: int
    label: str
    values: list[str]
    question: str
    choices: list[str] = []
    extended_choices: list[str] = []  # values added to the question's choices for this replay
    requests: int = 0  # per variant; 0 = one per value
    rate: float = 1.0
    concurrency: int = 4
    variants: list[str] = list(VARIANTS)
    max_tokens: int = 16
    seed: int = 0


class Replay(Base):
    """One serving replay of a notebook's field edit; `status` takes the runs' statuses."""

    __tablename__ = "replays"
    __table_args__ = (CheckConstraint(f"status IN ({', '.join(map(repr, RUN_STATUSES))})", name="status"),
                      NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int | None] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"),
                                                    index=True)
    snapshot: Mapped[ReplaySnapshot] = mapped_column(Typed(ReplaySnapshot))
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED.value)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    task_id: Mapped[str | None] = mapped_column(String(64), default=new_task_id)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    result: Mapped[ReplayResult | None] = mapped_column(Typed(ReplayResult | None))

    @validates("snapshot")
    def _typed_snapshot(self, _key: str, value: Any) -> ReplaySnapshot:
        return ReplaySnapshot.model_validate(value)

    @property
    def is_finished(self) -> bool:
        return self.status in RUN_FINISHED
