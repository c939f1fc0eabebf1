"""Notebooks a team can manage: which bundled example a notebook was loaded from (loading it again
offers the existing notebook instead of a silent copy), and an index on (updated_at, id) so the
paginated home page reads one page of 10,000 notebooks without sorting them all.

Existing notebooks get no example (NULL): they were loaded before this was recorded.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("notebooks") as batch:
        batch.add_column(sa.Column("example", sa.String(length=64), nullable=True))
        batch.create_index("ix_notebooks_example", ["example"], unique=False)
        batch.create_index("ix_notebooks_updated_at_id", ["updated_at", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("notebooks") as batch:
        batch.drop_index("ix_notebooks_updated_at_id")
        batch.drop_index("ix_notebooks_example")
        batch.drop_column("example")
