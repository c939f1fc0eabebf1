"""What a run computed in and where: `runs.dtype` ("float32", "bfloat16", "float16") and
`runs.device` ("cpu", "cuda:0", "cuda:0+cuda:1"), from the engine's report. Runs stored before this
have neither (NULL): they ran before it was recorded (float32 on CPU unless a GPU worker ran them).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("dtype", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("device", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("device")
        batch.drop_column("dtype")
