"""A notebook's per-field policies: adopted from a sweep that edited its fields separately, one
entry per field label (`data.contracts.FieldPolicy`: strategy, threshold, sentence, cost share) as
JSON. Nullable: none adopted (the overall `policy_strategy`, if any, applies to every run).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("notebooks") as batch:
        batch.add_column(sa.Column("policy_fields", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("notebooks") as batch:
        batch.drop_column("policy_fields")
