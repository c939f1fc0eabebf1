"""Sweeps that decide (issue 31): `stop_when_decided` (the sweep stops as soon as its policy cannot
change), `stopped` (why it ended: decided, exhausted or cancelled; null while it runs) and
`extended_choices` (values outside the question's choices that were added to them, on request).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("stop_when_decided", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("stopped", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("extended_choices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("extended_choices")
        batch.drop_column("stopped")
        batch.drop_column("stop_when_decided")
