"""Trajectories: one row per trajectory a user started from a notebook (`POST
/api/notebooks/{id}/trajectories`): what it runs (`vocabulary.trajectories.TrajectorySpec`, written
by the web and read by the worker's `kvnotes.trajectory`), where it is (`turns_done` of
`turns_total`), and the turns read so far (`turns`: one `TurnRecord` per turn, written after each
turn, so a cancelled or failed trajectory keeps the turns it read). Deleting the notebook deletes
its trajectories (their specs hold its document).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import CheckConstraint, DateTime, Float, ForeignKey, Integer, String, Text
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
from vocabulary.trajectories import TrajectorySpec, TurnRecord

_SPEC = TypeAdapter(TrajectorySpec)


class Trajectory(Base):
    """One trajectory of a notebook; `status` takes the runs' statuses."""

    __tablename__ = "trajectories"
    __table_args__ = (CheckConstraint(f"status IN ({', '.join(map(repr, RUN_STATUSES))})", name="status"),
                      NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int | None] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"),
                                                    index=True)
    model: Mapped[str] = mapped_column(String(200))
    spec: Mapped[TrajectorySpec] = mapped_column(Typed(TrajectorySpec))
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED.value, index=True)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    turns_total: Mapped[int] = mapped_column(Integer, default=0)
    turns_done: Mapped[int] = mapped_column(Integer, default=0)
    turns: Mapped[list[TurnRecord]] = mapped_column(Typed(list[TurnRecord]), default=list)
    error: Mapped[str | None] = mapped_column(Text)
    task_id: Mapped[str | None] = mapped_column(String(64), default=new_task_id)
    created_by: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the worker that holds it and its last heartbeat (`data.jobs`: the one reaper reads them)
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    @validates("spec")
    def _typed_spec(self, _key: str, value: Any) -> TrajectorySpec:
        return _SPEC.validate_python(value)

    @property
    def is_finished(self) -> bool:
        return self.status in RUN_FINISHED
