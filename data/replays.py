"""Serving replays: one row per replay a user started from a notebook (the Serving panel or
`POST /api/notebooks/{id}/replays`) or from one of its trajectories (the trajectory page's panel or
`POST /api/trajectories/{id}/replays`), what it replays (`vocabulary.replay.ReplaySpec`, or a
`TrajectoryReplaySpec` naming its trajectory; written by the web and read by the worker's
`kvnotes.replay`), where it is, and what it measured (`ReplayResult`, `TrajectoryReplayResult`).

A replay that fails keeps its error and no result: nothing half measured is ever shown as a result.
Deleting the notebook deletes its replays (their snapshots hold its document).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
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
from vocabulary.replay import ReplayResult, ReplaySpec, TrajectoryReplayResult, TrajectoryReplaySpec

AnySpec = ReplaySpec | TrajectoryReplaySpec
AnyResult = ReplayResult | TrajectoryReplayResult
_SPEC = TypeAdapter(AnySpec)


class Replay(Base):
    """One serving replay of a notebook's field edit, or of a trajectory of the notebook (its
    snapshot a `TrajectoryReplaySpec`); `status` takes the runs' statuses."""

    __tablename__ = "replays"
    __table_args__ = (CheckConstraint(f"status IN ({', '.join(map(repr, RUN_STATUSES))})", name="status"),
                      NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    notebook_id: Mapped[int | None] = mapped_column(ForeignKey("notebooks.id", ondelete="CASCADE"),
                                                    index=True)
    snapshot: Mapped[AnySpec] = mapped_column(Typed(AnySpec))
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED.value)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    task_id: Mapped[str | None] = mapped_column(String(64), default=new_task_id)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the worker that holds it and its last heartbeat (`data.jobs`: the one reaper reads them)
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    result: Mapped[AnyResult | None] = mapped_column(Typed(AnyResult | None))

    @validates("snapshot")
    def _typed_snapshot(self, _key: str, value: Any) -> AnySpec:
        return _SPEC.validate_python(value)

    @property
    def trajectory_id(self) -> int | None:
        """The trajectory it replays (None: a notebook's field edit)."""
        return self.snapshot.trajectory_id if isinstance(self.snapshot, TrajectoryReplaySpec) else None

    @property
    def is_finished(self) -> bool:
        return self.status in RUN_FINISHED
