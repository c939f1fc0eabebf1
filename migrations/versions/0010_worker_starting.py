"""What a starting worker is doing before it can take a run: `workers.starting` ("loading
tiny-llama", "converting smollm2-135m"; NULL once it is ready). Health is "ok" only when a run could
start, so it names a worker still loading or converting its model instead of counting it as live.
Rows written before this have NULL: they count as ready, as they did.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("starting", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("starting")
