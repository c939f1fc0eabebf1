"""The database engine and sessions, built from settings.

SQLite (the embedded default) gets `check_same_thread=False` (FastAPI serves from a thread pool),
enforced foreign keys (without them SQLite ignores ON DELETE CASCADE / SET NULL), no memory-mapped
I/O (`mmap_size=0`) and, by default, the rollback journal (`KVNOTES_SQLITE_JOURNAL=delete`; see
"What cannot be recovered in-process" for why not WAL, and docs/load.md for what it costs).

Capacity: the web app lets `KVNOTES_DB_POOL_SIZE` requests in at once (`app.api.capacity`) and the
pool holds that many connections plus as many again for a request's own short second transaction
(noting an API token's use), so a request never waits long for a connection, and a wait past
`POOL_TIMEOUT_S` is a 503, never a 500. `/api/health` has its own small pool
(`get_health_sessionmaker`): it answers while every request connection is busy.

Reading: JSON columns are read by `vocabulary.text_rules.loads`, so a row saved before the text
rules held (a lone surrogate in a snapshot, a sweep's question, a replay's values) reads with U+FFFD
in its place and renders with its id everywhere, instead of failing every page that shows it.

Recovery: SQLite silently opens a database file it cannot write read-only, and such a connection stays
read-only for its life; worse, while any connection of the process (even one dropped, but not yet
garbage) holds the file read-only, the process shares that read-only WAL index with every new
connection, so a read-only episode outlived itself until a restart. The app's pools therefore do not
open a SQLite file this process cannot write (`writable_only`): while it cannot be written, requests
that need the database answer 503 (nothing read-only is ever opened), and the first connection after
it is read-write. An error saying the database is not writable also starts a new generation of
connections (the failing one dropped, idle ones closed, ones in use replaced at their next checkout).

What cannot be recovered in-process, and so is never mapped: in WAL mode every SQLite connection
memory-maps the WAL index (`-shm`), shared between processes (`mmap_size` is about the database file
and does not change that; only `locking_mode=EXCLUSIVE` avoids it, locking every other process
out). When storage takes `-shm` away under a mapping (it goes read-only after an error, or is made
immutable: ext4 answers a write to an immutable file's mapped page with SIGBUS), the next touch of
that memory is a SIGBUS, which no Python code can catch: web processes and workers died so, and
requests in flight lost their connection. So the default journal is the rollback journal, which
maps nothing: a file storage took away is an I/O error, answered 503, and the process stays up. WAL
remains a choice (`KVNOTES_SQLITE_JOURNAL=wal`: faster reads beside a writer), under the
supervision that restarts a process such a fault kills (`commands.web`, `commands.supervisor`;
`kvnotes serve` holds no connection itself: `release_connections`).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from data.settings import get_settings
from vocabulary import text_rules

POOL_TIMEOUT_S = 5.0  # the limiter keeps requests within the pool: a longer wait is a fault (503)
HEALTH_POOL_SIZE = 2
HEALTH_POOL_TIMEOUT_S = 1.0
STALE_CONNECTION_ERRORS = ("readonly database", "read-only file system", "disk i/o error",
                           "unable to open database file")
log = logging.getLogger(__name__)
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()  # every engine made here, to close them all at once
_generation = [0]  # connections opened before the last "not writable" error are not used again


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA mmap_size=0")  # the database file read by read(), never through a mapping
    if get_settings().sqlite_journal == "wal":
        cursor.execute("PRAGMA journal_mode=WAL")
    else:
        _leave_wal(cursor)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def _leave_wal(cursor: Any) -> None:
    """A database left in WAL (it persists in the file) goes back to the rollback journal; only a
    connection alone on the file can do that (`kvnotes serve` migrates alone first), so another's
    open connections leave it in WAL for now (no wait: busy_timeout 0), said once in the log."""
    if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        return
    cursor.execute("PRAGMA busy_timeout=0")
    try:
        cursor.execute("PRAGMA journal_mode=DELETE")
    except Exception as exc:  # noqa: BLE001 - sqlite3.OperationalError: another process holds it open
        log.warning("database stays in WAL until it is opened alone", extra={"reason": str(exc)})


def _stamp(_dbapi_connection: Any, record: Any) -> None:
    record.info["generation"] = _generation[0]


def _refuse_stale(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """At checkout: a connection of an older generation is replaced by a fresh one."""
    if record.info.get("generation") != _generation[0]:
        raise DisconnectionError("opened before the database became writable again")


def _discard_stale_connections(context: ExceptionContext) -> None:
    """A connection that found its database read-only (or its disk gone) is not reused: the error
    counts as a disconnect (this connection is dropped), every pool's idle connections are closed
    and the ones in use are replaced at their next checkout, so the process opens the file afresh."""
    if any(words in str(context.original_exception).lower() for words in STALE_CONNECTION_ERRORS):
        context.is_disconnect = True
        _generation[0] += 1
        for engine in list(_ENGINES):
            engine.pool.dispose()  # the same pool: connections in use come back to it, then are replaced
        log.warning("database not writable: pooled connections closed, the next ones open afresh")


def _refuse_read_only_open(dialect: Any, _record: Any, cargs: tuple, _cparams: dict) -> None:
    """Before SQLite opens the file: refuse when this process cannot write it, instead of letting
    SQLite fall back to a read-only handle (see the module's docstring)."""
    path = _sqlite_file(str(cargs[0]) if cargs else "")
    if path and os.path.exists(path) and not os.access(path, os.W_OK):
        raise dialect.dbapi.OperationalError("attempt to write a readonly database (file not writable)")


def _sqlite_file(database: str) -> str:
    """The file path of a pysqlite `database` argument (a plain path or a `file:` URI); '' for memory."""
    if database.startswith("file:"):
        database = database[len("file:"):].split("?", 1)[0]
    return "" if not database or database == ":memory:" else database


def make_engine(url: str, pool_size: int | None = None, pool_timeout: float = POOL_TIMEOUT_S) -> Engine:
    """An engine for `url` with `pool_size` connections (default `KVNOTES_DB_POOL_SIZE`) and as many
    again in overflow, with the SQLite settings above when it is SQLite."""
    size = pool_size or get_settings().db_pool_size
    if url.startswith("sqlite"):
        pool = {} if ":memory:" in url or url in ("sqlite://", "sqlite:///") else {
            "pool_size": size, "max_overflow": size, "pool_timeout": pool_timeout}
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               json_deserializer=text_rules.loads, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True, pool_size=size, max_overflow=size,
                               pool_timeout=pool_timeout, json_deserializer=text_rules.loads)
    event.listen(engine, "handle_error", _discard_stale_connections)
    event.listen(engine, "connect", _stamp)
    event.listen(engine, "checkout", _refuse_stale)
    _ENGINES.add(engine)
    return engine


def writable_only(engine: Engine) -> Engine:
    """`engine`, refusing to open a SQLite file it cannot write (the app's pools: nothing read-only
    is ever pooled). Migrations open as SQLite does: they may read a read-only file."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "do_connect", _refuse_read_only_open)
    return engine


@lru_cache(maxsize=4)
def get_engine(url: str | None = None) -> Engine:
    """The process's engine (read-write SQLite connections only: see the module's docstring)."""
    return writable_only(make_engine(url or get_settings().database_url))


@lru_cache(maxsize=4)
def get_sessionmaker(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@lru_cache(maxsize=1)
def get_health_sessionmaker() -> sessionmaker[Session]:
    """Sessions on a pool of their own, for `/api/health`: it must answer while the app is saturated."""
    engine = writable_only(make_engine(get_settings().database_url, HEALTH_POOL_SIZE, HEALTH_POOL_TIMEOUT_S))
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


def release_connections() -> None:
    """Close every pooled connection of this process (they reopen when next needed). `kvnotes serve`'s
    supervising process calls it once it has migrated and checked: it then holds no SQLite file,
    so no memory-mapped WAL index (`-shm`) of a database that storage took away can kill it."""
    for engine in list(_ENGINES):
        engine.dispose()


def reset_engines() -> None:
    """Forget cached engines (tests that switch `DATABASE_URL` call this after `get_settings`'s)."""
    for cached in (get_engine, get_sessionmaker, get_health_sessionmaker):
        cached.cache_clear()
