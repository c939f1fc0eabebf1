"""Trajectories: the `trajectories` table, one row per trajectory of a notebook: its spec (the
document, fields and turns as they were, `vocabulary.trajectories.TrajectorySpec`), where it is
(turns_done of turns_total) and the turns read so far (JSON, one `TurnRecord` per turn).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def upgrade() -> None:
    op.create_table(
        "trajectories",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("notebook_id", sa.Integer(),
                  sa.ForeignKey("notebooks.id", ondelete="CASCADE",
                                name="fk_trajectories_notebook_id_notebooks"),
                  nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("turns_total", sa.Integer(), nullable=False),
        sa.Column("turns_done", sa.Integer(), nullable=False),
        sa.Column("turns", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"status IN ({', '.join(map(repr, STATUSES))})", name="ck_trajectories_status"),
        sa.PrimaryKeyConstraint("id", name="pk_trajectories"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_trajectories_notebook_id", "trajectories", ["notebook_id"])
    op.create_index("ix_trajectories_status", "trajectories", ["status"])
    op.create_index("ix_trajectories_created_by", "trajectories", ["created_by"])


def downgrade() -> None:
    op.drop_index("ix_trajectories_created_by", table_name="trajectories")
    op.drop_index("ix_trajectories_status", table_name="trajectories")
    op.drop_index("ix_trajectories_notebook_id", table_name="trajectories")
    op.drop_table("trajectories")
