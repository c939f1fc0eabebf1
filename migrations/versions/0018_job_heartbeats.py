"""One job lifecycle (issue 34): trajectories and replays get what runs already have, the worker
that holds one (`worker`) and its last heartbeat (`heartbeat_at`), so the one reaper
(`data.jobs.reap`) treats every kind of job alike.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("trajectories", "replays")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("worker", sa.String(200), nullable=True))
            batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("heartbeat_at")
            batch.drop_column("worker")
