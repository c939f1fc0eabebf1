"""Sweeps: many edits of one notebook's fields, each an ordinary run. The `sweeps` table, and on
`runs` the sweep an edit belongs to (`sweep_id`, deleted with its sweep), what the edit sets
(`sweep_edit`) and how many times a worker took it (`attempts`: a sweep's edit lost with its worker
is retried once, then failed). Runs stored before this belong to no sweep and were taken 0 times.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("notebook_id", sa.Integer(),
                  sa.ForeignKey("notebooks.id", ondelete="CASCADE", name="fk_sweeps_notebook_id_notebooks"),
                  nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("question", sa.JSON(), nullable=False),
        sa.Column("strategies", sa.JSON(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("edits_total", sa.Integer(), nullable=False),
        sa.Column("edits_done", sa.Integer(), nullable=False),
        sa.Column("edits_skipped", sa.Integer(), nullable=False),
        sa.Column("document_prefills", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"status IN ({', '.join(map(repr, STATUSES))})", name="ck_sweeps_status"),
        sa.PrimaryKeyConstraint("id", name="pk_sweeps"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_sweeps_notebook_id", "sweeps", ["notebook_id"])
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    op.create_index("ix_sweeps_created_by", "sweeps", ["created_by"])
    # A foreign key makes SQLite rebuild the table: keep its AUTOINCREMENT (ids never reused, 0006).
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("sweep_edit", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), server_default="0", nullable=False))
        batch.create_foreign_key("fk_runs_sweep_id_sweeps", "sweeps", ["sweep_id"], ["id"],
                                 ondelete="CASCADE")
        batch.create_index("ix_runs_sweep_id", ["sweep_id"])


def downgrade() -> None:
    # A foreign key makes SQLite rebuild the table: keep its AUTOINCREMENT (ids never reused, 0006).
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_index("ix_runs_sweep_id")
        batch.drop_constraint("fk_runs_sweep_id_sweeps", type_="foreignkey")
        batch.drop_column("attempts")
        batch.drop_column("sweep_edit")
        batch.drop_column("sweep_id")
    op.drop_index("ix_sweeps_created_by", table_name="sweeps")
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    op.drop_index("ix_sweeps_notebook_id", table_name="sweeps")
    op.drop_table("sweeps")
