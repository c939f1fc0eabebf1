"""Why a decision moved, causally: `runs.mechanism` holds a run's knockout rows, selective@K curves
and logit lens (JSON, asked for with the snapshot's `mechanism`). Runs stored before this have none
(NULL): they were not asked for it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("mechanism", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("mechanism")
