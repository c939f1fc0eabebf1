"""The database engine and sessions, built from settings.

SQLite (the embedded default) gets `check_same_thread=False` (FastAPI serves from a thread pool),
WAL journaling (the web app reads while a worker writes) and enforced foreign keys (without them
SQLite ignores ON DELETE CASCADE / SET NULL).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from data.settings import get_settings


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for `url`, with the SQLite settings above when it is SQLite."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


@lru_cache(maxsize=4)
def get_engine(url: str | None = None) -> Engine:
    return make_engine(url or get_settings().database_url)


@lru_cache(maxsize=4)
def get_sessionmaker(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


def get_session() -> Iterator[Session]:
    """FastAPI dependency: one session per request, rolled back if the request fails."""
    with get_sessionmaker()() as session:
        try:
            yield session
        except Exception:
            session.rollback()
            raise


def reset_engines() -> None:
    """Forget cached engines (tests that switch `DATABASE_URL` call this after `get_settings`'s)."""
    for cached in (get_engine, get_sessionmaker):
        cached.cache_clear()
