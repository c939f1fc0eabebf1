"""Verdicts a user can trust, and the notes map: per-strategy answer F1, recompute-answer NLL,
time to first token, decode time and the exact-prefix serving-cache share; where every question
and answer token looked (not only the decision); a run's notes map.

Existing rows keep their results: the new numbers default to 0 (NLL and the notes map to NULL),
which the pages show as "not measured" for runs made before this revision.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ZERO_DEFAULT = ("answer_f1", "ttft_ms", "decode_ms", "prefix_cache_share")


def upgrade() -> None:
    with op.batch_alter_table("run_results") as batch:
        for name in ZERO_DEFAULT:
            batch.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("recompute_answer_nll", sa.Float(), nullable=True))
        batch.add_column(sa.Column("decision_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("query_attention", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("query_start", sa.Integer(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("attribution", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("attribution")
    with op.batch_alter_table("run_results") as batch:
        for name in ("query_start", "query_attention", "decision_index", "recompute_answer_nll"):
            batch.drop_column(name)
        for name in reversed(ZERO_DEFAULT):
            batch.drop_column(name)
