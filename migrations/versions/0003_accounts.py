"""Safe on a shared server: users, API tokens and share links; who made each notebook, skill and
run; the live-worker registry; a health probe row; deleting a notebook deletes its runs.

Runs whose notebook was deleted before this revision (`notebook_id` NULL) are kept as they are
(deleting data in a migration is the operator's call: `DELETE FROM runs WHERE notebook_id IS NULL`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS_NOTEBOOK_FK = "fk_runs_notebook_id_notebooks"


def _when(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        _when("created_at"),
        sa.CheckConstraint("role IN ('editor', 'viewer')", name="ck_users_role"),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("name", name="uq_users_name"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(),
                  sa.ForeignKey("users.id", ondelete="CASCADE", name="fk_api_tokens_user_id_users"),
                  nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("hint", sa.String(length=16), nullable=False),
        sa.Column("label", sa.String(length=100), nullable=False),
        _when("created_at"),
        _when("last_used_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_sha256", name="uq_api_tokens_token_sha256"),
    )
    op.create_index("ix_api_tokens_user_id", "api_tokens", ["user_id"])
    op.create_table(
        "share_links",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(),
                  sa.ForeignKey("runs.id", ondelete="CASCADE", name="fk_share_links_run_id_runs"),
                  nullable=False),
        sa.Column("nonce", sa.String(length=32), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        _when("created_at"),
        _when("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_share_links"),
    )
    op.create_index("ix_share_links_run_id", "share_links", ["run_id"])
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        _when("started_at"),
        _when("beat_at"),
        sa.Column("running_run_id", sa.Integer(), nullable=True),
        _when("idle_since", nullable=True),
        _when("stopped_at", nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_workers"),
    )
    op.create_table(
        "health_probe",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        _when("checked_at"),
        sa.PrimaryKeyConstraint("id", name="pk_health_probe"),
    )
    for table in ("notebooks", "skills"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("created_by", sa.String(length=64), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("created_by", sa.String(length=64), nullable=True))
        batch.create_index("ix_runs_created_by", ["created_by"])
        batch.drop_constraint(RUNS_NOTEBOOK_FK, type_="foreignkey")
        batch.create_foreign_key(RUNS_NOTEBOOK_FK, "notebooks", ["notebook_id"], ["id"], ondelete="CASCADE")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(RUNS_NOTEBOOK_FK, type_="foreignkey")
        batch.create_foreign_key(RUNS_NOTEBOOK_FK, "notebooks", ["notebook_id"], ["id"], ondelete="SET NULL")
        batch.drop_index("ix_runs_created_by")
        batch.drop_column("created_by")
    for table in ("skills", "notebooks"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("created_by")
    op.drop_table("health_probe")
    op.drop_table("workers")
    op.drop_index("ix_share_links_run_id", table_name="share_links")
    op.drop_table("share_links")
    op.drop_index("ix_api_tokens_user_id", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("users")
