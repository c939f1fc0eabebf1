"""Sessions that end: one row per sign-in (the cookie names it; signing out or changing the password
deletes it, so a saved cookie stops working), and the failed sign-ins counted per account and per
client address (what the login limit's backoff reads).

Sessions signed before this revision carry no row: they end, and their users sign in again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "user_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(),
                  sa.ForeignKey("users.id", ondelete="CASCADE", name="fk_user_sessions_user_id_users"),
                  nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        _when("created_at"),
        _when("expires_at"),
        sa.PrimaryKeyConstraint("id", name="pk_user_sessions"),
        sa.UniqueConstraint("secret_sha256", name="uq_user_sessions_secret_sha256"),
    )
    op.create_index("ix_user_sessions_user_id", "user_sessions", ["user_id"])
    op.create_table(
        "login_failures",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        _when("last_failure_at"),
        _when("locked_until", nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_login_failures"),
    )


def downgrade() -> None:
    op.drop_table("login_failures")
    op.drop_index("ix_user_sessions_user_id", table_name="user_sessions")
    op.drop_table("user_sessions")
