"""Migration 0006 on a SQLite database that already holds notebooks, runs and fields: every row, id,
foreign key and check survives the rebuild, the sequence starts at today's largest id, and from then
on a deleted id is never issued again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command

from data.migrate import alembic_config, upgrade_to_head

NOW = "2026-12-01 12:00:00"


def _insert_notebook(db: sqlite3.Connection, title: str) -> int:
    cursor = db.execute("INSERT INTO notebooks (title, model, document, created_at, updated_at) "
                        "VALUES (?, 'smollm2-135m', 'status: active', ?, ?)", (title, NOW, NOW))
    return int(cursor.lastrowid)


def _seed(db: sqlite3.Connection) -> None:
    for title in ("one", "two", "three"):
        nb = _insert_notebook(db, title)
        db.execute('INSERT INTO fields (notebook_id, start, "end", old_value, new_value, label, created_at) '
                   "VALUES (?, 8, 14, 'active', 'closed', 'status', ?)", (nb, NOW))
        db.execute("INSERT INTO runs (notebook_id, kind, snapshot, strategies, status, stage, progress, "
                   "timings, created_at) VALUES (?, 'edit', '{}', '[]', 'succeeded', 'done', 1.0, '{}', ?)",
                   (nb, NOW))
    db.execute("DELETE FROM runs WHERE notebook_id = 3")
    db.execute("DELETE FROM fields WHERE notebook_id = 3")
    db.execute("DELETE FROM notebooks WHERE id = 3")  # before 0006 nothing remembers that 3 was issued
    db.commit()


def test_the_migration_keeps_the_data_and_ids_are_never_reused_after_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    command.upgrade(alembic_config(url), "0005")
    with sqlite3.connect(path) as db:
        _seed(db)
        assert _insert_notebook(db, "reused") == 3  # the old behaviour: the deleted id again
        db.execute("DELETE FROM notebooks WHERE id = 3")
        db.commit()
    upgrade_to_head(url)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA foreign_keys=ON")
        schema = db.execute("SELECT sql FROM sqlite_master WHERE name = 'notebooks'").fetchone()[0]
        assert "AUTOINCREMENT" in schema
        titles = db.execute("SELECT id, title FROM notebooks ORDER BY id").fetchall()
        assert titles == [(1, "one"), (2, "two")]
        assert db.execute("SELECT id, notebook_id FROM runs ORDER BY id").fetchall() == [(1, 1), (2, 2)]
        sequence = dict(db.execute("SELECT name, seq FROM sqlite_sequence"))
        assert sequence["notebooks"] == 2  # today's largest id
        third = _insert_notebook(db, "after")
        db.execute("DELETE FROM notebooks WHERE id = ?", (third,))
        fourth = _insert_notebook(db, "after the delete")
        assert (third, fourth) == (3, 4)  # the deleted newest id is not issued again
        db.execute("DELETE FROM notebooks WHERE id = 1")  # foreign keys survived: the cascade still runs
        assert db.execute("SELECT count(*) FROM fields WHERE notebook_id = 1").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM runs WHERE notebook_id = 1").fetchone()[0] == 0
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):  # the checks survived too
            db.execute("UPDATE runs SET status = 'lost' WHERE id = 2")
