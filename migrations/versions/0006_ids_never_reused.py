"""Ids that are never reused: every table whose ids appear in addresses (notebooks, runs, and what
hangs on them) becomes `AUTOINCREMENT` on SQLite, so a deleted notebook's or run's id is never given
to a new one and an old link never opens someone else's work.

SQLite without AUTOINCREMENT hands out max(id) + 1, so deleting the newest row frees its id. With it,
SQLite keeps the highest id ever issued in `sqlite_sequence`; copying the rows into the rebuilt
table seeds it with today's largest id. PostgreSQL sequences never go back: nothing to do there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# parents first: a child's rebuild must find its parent's table in place
TABLES = ("notebooks", "skills", "fields", "errata", "placements", "questions", "runs", "run_results")


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        kwargs = {"sqlite_autoincrement": autoincrement}
        with op.batch_alter_table(table, recreate="always", table_kwargs=kwargs):
            pass


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
    if op.get_bind().dialect.name == "sqlite":
        names = ", ".join(repr(t) for t in TABLES)
        op.execute(sa.text(f"DELETE FROM sqlite_sequence WHERE name IN ({names})"))
