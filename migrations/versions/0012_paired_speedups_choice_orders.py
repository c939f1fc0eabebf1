"""Speed-ups you can trust and choices that measure the notes: on `run_results`, the speed-up over
recompute as the median (`speedup`) and [min, max] (`speedup_range`) over paired timing rounds, each
choice's [min, max] probability over the cyclic orders of the choices (`choice_spread`), and the
position the answer follows more than the document (`order_bias`).

Rows stored before this keep their results: they were timed against one recompute timing and their
choices scored in the listed order only, so `speedup` and `order_bias` stay NULL (not measured), and
`speedup_range` and `choice_spread` are empty (the page reads such runs as it did).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        batch.add_column(sa.Column("speedup", sa.Float(), nullable=True))
        batch.add_column(sa.Column("speedup_range", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("choice_spread", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("order_bias", sa.String(16), nullable=True))
    results = sa.table("run_results", sa.column("speedup_range", sa.JSON),
                       sa.column("choice_spread", sa.JSON))
    op.get_bind().execute(results.update().values(speedup_range=[], choice_spread={}))
    with op.batch_alter_table("run_results") as batch:
        batch.alter_column("speedup_range", existing_type=sa.JSON(), nullable=False)
        batch.alter_column("choice_spread", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        for name in ("order_bias", "choice_spread", "speedup_range", "speedup"):
            batch.drop_column(name)
