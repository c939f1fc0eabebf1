"""Strategies as objects: auto's pick as a typed column, the spread of the repeated time to first
token, and whether each strategy's answer followed the edit.

Existing rows keep their results: `picked` is read back from auto's old detail ("picked stale"),
`ttft_spread_ms` is [ttft_ms, ttft_ms] (those runs were timed once), and `edit_followed` stays NULL
(not measured).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PICKED_PREFIX = "picked "


def upgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        batch.add_column(sa.Column("picked", sa.String(32), nullable=True))
        batch.add_column(sa.Column("ttft_spread_ms", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("edit_followed", sa.String(16), nullable=True))
    _backfill(op.get_bind())
    with op.batch_alter_table("run_results") as batch:
        batch.alter_column("ttft_spread_ms", existing_type=sa.JSON(), nullable=False)


def _backfill(bind: sa.engine.Connection) -> None:
    results = sa.table("run_results", sa.column("id", sa.Integer), sa.column("strategy", sa.String),
                       sa.column("detail", sa.Text), sa.column("ttft_ms", sa.Float),
                       sa.column("picked", sa.String), sa.column("ttft_spread_ms", sa.JSON))
    columns = (results.c.id, results.c.strategy, results.c.detail, results.c.ttft_ms)
    for ident, strategy, detail, ttft in bind.execute(sa.select(*columns)).all():
        was_picked = strategy == "auto" and (detail or "").startswith(PICKED_PREFIX)
        picked = detail[len(PICKED_PREFIX):] if was_picked else None
        bind.execute(results.update().where(results.c.id == ident)
                     .values(picked=picked, ttft_spread_ms=[ttft or 0.0, ttft or 0.0]))


def downgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        for name in ("edit_followed", "ttft_spread_ms", "picked"):
            batch.drop_column(name)
