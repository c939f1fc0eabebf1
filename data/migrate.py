"""Bring a database to the newest schema from Python (`kvnotes serve` calls this before starting).

Uses the repository's `alembic.ini` and `migrations/`, so the command line (`alembic upgrade head`)
and the app apply exactly the same revisions.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config

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
    command.upgrade(config, "head")


def downgrade_to_base(url: str | None = None) -> None:
    """Undo every migration (tests use it to prove each revision can be reversed)."""
    command.downgrade(alembic_config(url), "base")

