"""Serving replays: one row per replay of a notebook's field edit on a vLLM server (`data.replays`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def _when(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)


def upgrade() -> None:
    op.create_table(
        "replays",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("notebook_id", sa.Integer(),
                  sa.ForeignKey("notebooks.id", ondelete="CASCADE", name="fk_replays_notebook_id_notebooks"),
                  nullable=True),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _when("started_at"),
        _when("finished_at"),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.CheckConstraint(f"status IN ({', '.join(map(repr, STATUSES))})", name="ck_replays_status"),
        sa.PrimaryKeyConstraint("id", name="pk_replays"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_replays_notebook_id", "replays", ["notebook_id"])


def downgrade() -> None:
    op.drop_index("ix_replays_notebook_id", table_name="replays")
    op.drop_table("replays")
