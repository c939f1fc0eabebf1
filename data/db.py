"""The database engine and sessions, built from settings.

SQLite (the embedded default) gets `check_same_thread=False` (FastAPI serves from a thread pool),
WAL journaling (the web app reads while a worker writes) and enforced foreign keys (without them
SQLite ignores ON DELETE CASCADE / SET NULL).

Capacity: the pool holds `KVNOTES_DB_POOL_SIZE` connections and no overflow; the web app lets that
many requests in at once (`app.api.capacity`), so a request never waits long for a connection, and a
wait past `POOL_TIMEOUT_S` is a 503, never a 500. `/api/health` has its own small pool
(`get_health_sessionmaker`): it answers while every request connection is busy.

Recovery: SQLite opens a database file it cannot write read-only, and such a connection stays
read-only for its life. An error saying so ("attempt to write a readonly database") therefore
discards the pooled connections (treated like a lost connection), so once storage is writable again
the next connection is opened read-write, without a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from data.settings import get_settings

POOL_TIMEOUT_S = 5.0  # the limiter keeps requests within the pool: a longer wait is a fault (503)
HEALTH_POOL_SIZE = 2
HEALTH_POOL_TIMEOUT_S = 1.0
STALE_CONNECTION_ERRORS = ("readonly database", "read-only file system", "disk i/o error")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def _discard_stale_connections(context: ExceptionContext) -> None:
    """A connection that found its database read-only (or its disk gone) is not reused: marking the
    error a disconnect makes SQLAlchemy invalidate the pool, so later connections open afresh."""
    if any(words in str(context.original_exception).lower() for words in STALE_CONNECTION_ERRORS):
        context.is_disconnect = True


def make_engine(url: str, pool_size: int | None = None, pool_timeout: float = POOL_TIMEOUT_S) -> Engine:
    """An engine for `url` with `pool_size` connections (default `KVNOTES_DB_POOL_SIZE`) and no
    overflow, with the SQLite settings above when it is SQLite."""
    size = pool_size or get_settings().db_pool_size
    if url.startswith("sqlite"):
        pool = {} if ":memory:" in url or url in ("sqlite://", "sqlite:///") else {
            "pool_size": size, "max_overflow": 0, "pool_timeout": pool_timeout}
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True, pool_size=size, max_overflow=0,
                               pool_timeout=pool_timeout)
    event.listen(engine, "handle_error", _discard_stale_connections)
    return engine


@lru_cache(maxsize=4)
def get_engine(url: str | None = None) -> Engine:
    return make_engine(url or get_settings().database_url)


@lru_cache(maxsize=4)
def get_sessionmaker(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@lru_cache(maxsize=1)
def get_health_sessionmaker() -> sessionmaker[Session]:
    """Sessions on a pool of their own, for `/api/health`: it must answer while the app is saturated."""
    engine = make_engine(get_settings().database_url, HEALTH_POOL_SIZE, HEALTH_POOL_TIMEOUT_S)
    return sessionmaker(bind=engine, expire_on_commit=False)


def get_session() -> Iterator[Session]:
    """FastAPI dependency: one session per request, rolled back if the request fails."""
    with get_sessionmaker()() as session:
        try:
            yield session
        except Exception:
            session.rollback()
            raise


def highest_issued_id(session: Session, table: str) -> int:
    """The largest id `table` has ever issued (deleted rows included): SQLite's `sqlite_sequence`
    (AUTOINCREMENT tables), PostgreSQL's sequence; 0 when none is known."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        query = text("SELECT seq FROM sqlite_sequence WHERE name = :table")
    elif dialect == "postgresql":
        query = text("SELECT s.last_value FROM pg_sequences s WHERE "
                     "format('%I.%I', s.schemaname, s.sequencename) = pg_get_serial_sequence(:table, 'id')")
    else:
        return 0
    try:
        return int(session.scalar(query, {"table": table}) or 0)
    except SQLAlchemyError:  # no sequence table yet (an empty SQLite database)
        session.rollback()
        return 0


def reset_engines() -> None:
    """Forget cached engines (tests that switch `DATABASE_URL` call this after `get_settings`'s)."""
    for cached in (get_engine, get_sessionmaker, get_health_sessionmaker):
        cached.cache_clear()
