"""The Alembic migrations take an empty database to head (matching the ORM exactly) and back down
to base, on SQLite and on PostgreSQL (a scratch database on 127.0.0.1:5432, user postgres)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from data.db import make_engine
from data.migrate import alembic_config, downgrade_to_base, upgrade_to_head
from data.models import Base
from tests.data.conftest import insert_old_run

TABLES = {"notebooks", "fields", "errata", "skills", "placements", "questions", "runs", "run_results"}
HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _check_round_trip(url: str) -> None:
    upgrade_to_head(url)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            assert TABLES <= set(inspect(connection).get_table_names())
            # the migration and the ORM describe the same schema: autogenerate would find nothing
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
            assert version == HEAD
        downgrade_to_base(url)
        with engine.connect() as connection:
            assert set(inspect(connection).get_table_names()) == {"alembic_version"}
    finally:
        engine.dispose()


def test_sqlite_upgrade_to_head_and_down_to_base(tmp_path: Path) -> None:
    _check_round_trip(f"sqlite:///{tmp_path}/migrations.db")


def test_sqlite_upgrade_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/twice.db"
    upgrade_to_head(url)
    upgrade_to_head(url)  # nothing left to apply: no error, still at head
    engine = make_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == HEAD
    engine.dispose()


def test_postgresql_upgrade_to_head_and_down_to_base(postgres_url: str) -> None:
    _check_round_trip(postgres_url)


def test_postgresql_cascades(postgres_url: str) -> None:
    """On PostgreSQL too: deleting a notebook removes its fields, errata and runs (a deleted document
    must not stay readable in a run's snapshot)."""
    upgrade_to_head(postgres_url)
    engine = make_engine(postgres_url)
    try:
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO notebooks (id, title, model, document, created_at, updated_at) "
                    "VALUES (1, 't', 'm', 'abc', now(), now())"
                )
            )
            c.execute(
                text(
                    'INSERT INTO fields (id, notebook_id, start, "end", old_value, new_value, label, '
                    "created_at) VALUES (1, 1, 0, 1, 'a', 'z', '', now())"
                )
            )
            c.execute(
                text(
                    "INSERT INTO errata (notebook_id, field_id, text, source, position, created_at) "
                    "VALUES (1, 1, 'e', 'generated', 0, now())"
                )
            )
            c.execute(
                text(
                    "INSERT INTO runs (id, notebook_id, kind, snapshot, strategies, status, stage, progress, "
                    "timings, created_at) "
                    "VALUES (7, 1, 'edit', '{}', '[]', 'queued', 'queued', 0, '{}', now())"
                )
            )
            c.execute(text("DELETE FROM notebooks WHERE id = 1"))
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM fields")).scalar_one() == 0
            assert c.execute(text("SELECT count(*) FROM errata")).scalar_one() == 0
            assert c.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0
    finally:
        engine.dispose()


def _one_old_result(url: str) -> None:
    """A database at revision 0001 holding one run with one result, as the first release wrote it."""
    command.upgrade(alembic_config(url), "0001")
    engine = make_engine(url)
    with engine.begin() as c:
        insert_old_run(c)
        c.execute(text("INSERT INTO run_results (run_id, strategy, decision, choice_probs, kl_to_recompute, "
                       "top1_agrees, topk_overlap, logit_cosine, decision_matches_recompute, "
                       "tokens_computed, latency_ms, text, detail) "
                       "VALUES (3, 'recompute', 'yes', '{}', 0, true, 10, 1, true, 40, 812.5, '', '')"))
    engine.dispose()


def _check_old_rows_survive(url: str) -> None:
    """Upgrading keeps every old result; the new numbers read as 0 / NULL ("not measured")."""
    _one_old_result(url)
    upgrade_to_head(url)
    from sqlalchemy.orm import Session

    from data.models import Run

    engine = make_engine(url)
    with Session(engine) as session:
        run = session.get(Run, 3)
        result = run.results[0]
        assert (result.decision, result.latency_ms, result.tokens_computed) == ("yes", 812.5, 40)
        assert (result.ttft_ms, result.decode_ms, result.answer_f1,
                result.recompute_answer_nll) == (0, 0, 0, None)
        assert run.attribution is None and run.snapshot.attribution is False
    engine.dispose()


def test_sqlite_database_from_0001_upgrades_with_its_results(tmp_path: Path) -> None:
    _check_old_rows_survive(f"sqlite:///{tmp_path}/old.db")


def test_postgresql_database_from_0001_upgrades_with_its_results(postgres_url: str) -> None:
    _check_old_rows_survive(postgres_url)
