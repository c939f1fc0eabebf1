"""A result's `orders_read` and `orders_total`: how many orders of the choices the decision was read
over, of those a full reading reads; fewer is a partial reading, stopped once no order left could
change the decision (issue 51 item 11). 0 and 0 for rows stored before and for free answers.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        batch.add_column(sa.Column("orders_read", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("orders_total", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        batch.drop_column("orders_total")
        batch.drop_column("orders_read")
