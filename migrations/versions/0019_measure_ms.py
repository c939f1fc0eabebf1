"""A result's `measure_ms`: reading a choice question's choices over their other orders (the
decision's debiasing), timed apart from the strategy's first token (issue 31). 0 for rows stored
before.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        batch.add_column(sa.Column("measure_ms", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        batch.drop_column("measure_ms")
