"""A notebook's adopted policy: the strategy a finished sweep's policy names (`auto` applies it on
later runs), the sweep it came from, the threshold it was read at and its sentence. All nullable:
no policy, `auto` is the oracle pick that costs every probe.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("notebooks") as batch:
        batch.add_column(sa.Column("policy_strategy", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("policy_sweep_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("policy_threshold", sa.Float(), nullable=True))
        batch.add_column(sa.Column("policy_sentence", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("notebooks") as batch:
        for name in ("policy_sentence", "policy_threshold", "policy_sweep_id", "policy_strategy"):
            batch.drop_column(name)
