"""Alembic environment: the URL from settings (or the one `data.migrate` hands over), the ORM's
metadata as the target, and batch mode so ALTERs work on SQLite."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from data import accounts, health, replays, trajectories, workers  # noqa: F401  (their tables belong to the schema too)
from data.db import make_engine
from data.models import Base
from data.settings import get_settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.attributes.get("url")
        or get_settings().database_url
    )


def _configure(**kwargs: object) -> None:
    context.configure(target_metadata=target_metadata, render_as_batch=True, compare_type=True, **kwargs)


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_with(connection: Connection) -> None:
    # SQLite's batch mode copies a table and drops the old one; with foreign keys enforced, that
    # drop would cascade (dropping `runs` would delete every run result). Off while migrating.
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
    if sqlite:
        connection.commit()
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _run_with(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
