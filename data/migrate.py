"""Bring a database to the newest schema from Python (`kvnotes serve` calls this before starting).

Uses the repository's `alembic.ini` and `migrations/`, so the command line (`alembic upgrade head`)
and the app apply exactly the same revisions. A SQLite database file is made (or kept) mode 0600:
it holds the password hashes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from data.settings import get_settings, redact

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger(__name__)


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for `url` (default: settings' `DATABASE_URL`), independent of the cwd."""
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.attributes["url"] = url or get_settings().database_url
    config.attributes["configure_logger"] = False  # keep the host process's logging as it is
    return config


def upgrade_to_head(url: str | None = None) -> None:
    """Apply every migration not yet applied to the database at `url`."""
    config = alembic_config(url)
    log.info("migrating database to head", extra={"url": redact(config.attributes["url"])})
    private_sqlite_file(config.attributes["url"])
    if url is None:  # the embedded broker and result backend hold task arguments and results too
        settings = get_settings()
        for other in (settings.broker_url.removeprefix("sqla+"), settings.result_backend.removeprefix("db+")):
            try:
                private_sqlite_file(other)
            except ArgumentError:  # not an SQLAlchemy URL (amqp://…): not a file of ours
                pass
    command.upgrade(config, "head")


def private_sqlite_file(url: str) -> None:
    """For a SQLite file URL: make the file (empty) readable by its owner only, or chmod it to 0600.
    SQLite gives its -wal, -shm and journal files the database file's mode."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    path = Path(parsed.database)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    elif path.stat().st_mode & 0o077:
        path.chmod(0o600)


def downgrade_to_base(url: str | None = None) -> None:
    """Undo every migration (tests use it to prove each revision can be reversed)."""
    command.downgrade(alembic_config(url), "base")

