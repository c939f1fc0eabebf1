"""The KV store's index: one small sqlite file beside the blocks, shared safely between processes.

It knows every stored file's key, kind ('block' | 'seq') and size, a least-recently-used order
(a logical clock, strictly increasing across processes) and the counters `stats()` reports. Each
call is one `BEGIN IMMEDIATE` transaction on the process's one connection (opened again after a
fork, or when the file was replaced or deleted under it, so a lost index is found and rebuilt).

The pragmas are `data/db.py`'s (copied: the engine layer never imports `data`): the rollback journal
(no WAL) and `mmap_size=0`, so no memory-mapped `-shm` exists that storage can take away under a
running worker (an immutable or vanished `-shm` faults the process in WAL mode; here it is an I/O
error, which the store's guard turns into a miss). An index left in WAL by an older version goes
back to the rollback journal when a connection opens it alone. The files themselves are
`worker.engine.store`'s.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    last_access INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
COUNTERS = ("hits", "misses", "evictions", "corrupt")
_CLOCK = "(SELECT COALESCE(MAX(last_access), 0) + 1 FROM entries)"

Entry = tuple[str, str, int]  # (key, kind, bytes)


class StoreIndex:
    """Sizes, LRU order and counters of a KV store's files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._opened: tuple[int, int] = (0, 0)  # (pid, inode) the connection was opened for
        with self._db() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.executemany("INSERT OR IGNORE INTO counters VALUES (?, 0)", [(c,) for c in COUNTERS])

    def _connection(self) -> sqlite3.Connection:
        """The process's connection, opened again after a fork or when the file is not the one it
        opened (replaced, deleted: then the schema is missing and the store rebuilds the index)."""
        try:
            inode = self.path.stat().st_ino
        except FileNotFoundError:
            inode = -1
        if self._conn is not None and self._opened == (os.getpid(), inode):
            return self._conn
        self.close()
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA mmap_size=0")  # as data/db.py: read(), never a mapping
        if db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            db.execute("PRAGMA busy_timeout=0")
            try:
                db.execute("PRAGMA journal_mode=DELETE")  # only alone on the file; else later
            except sqlite3.OperationalError:
                pass
            db.execute("PRAGMA busy_timeout=30000")
        self._conn, self._opened = db, (os.getpid(), self.path.stat().st_ino)
        return db

    def close(self) -> None:
        if self._conn is not None and self._opened[0] == os.getpid():
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self._connection()
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                db.execute("COMMIT")
            except BaseException:
                try:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                self.close()  # a failed connection is not used again
                raise

    def known(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        with self._db() as db:
            marks = ",".join("?" * len(keys))
            return {k for (k,) in db.execute(f"SELECT key FROM entries WHERE key IN ({marks})", keys)}

    def record(self, entries: list[Entry], touched: Sequence[str] = ()) -> None:
        """Add written files and move `touched` keys to the most-recent end, in one transaction."""
        with self._db() as db:
            for key in touched:
                db.execute(f"UPDATE entries SET last_access = {_CLOCK} WHERE key = ?", (key,))
            for key, kind, size in entries:
                db.execute(f"INSERT OR REPLACE INTO entries VALUES (?, ?, ?, {_CLOCK})", (key, kind, size))

    def after_read(self, read: list[Entry], **deltas: int) -> None:
        """One transaction after a lookup: move what was read to the most-recent end of the LRU
        order (re-adding entries another process's index lost while the verified file stayed) and
        add to the counters."""
        with self._db() as db:
            for key, kind, size in read:
                cur = db.execute(f"UPDATE entries SET last_access = {_CLOCK} WHERE key = ?", (key,))
                if cur.rowcount == 0:
                    db.execute(f"INSERT INTO entries VALUES (?, ?, ?, {_CLOCK})", (key, kind, size))
            _add(db, deltas)

    def forget(self, keys: list[str]) -> None:
        with self._db() as db:
            db.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k in keys])

    def count(self, **deltas: int) -> None:
        if any(deltas.values()):
            with self._db() as db:
                _add(db, deltas)

    def evict_to(self, budget_bytes: int) -> list[tuple[str, str]]:
        """Drop least-recently-used entries until the total fits `budget_bytes`; return their
        (key, kind) so the caller deletes the files."""
        with self._db() as db:
            total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
            if total <= budget_bytes:
                return []
            victims: list[tuple[str, str]] = []
            for key, kind, size in db.execute("SELECT key, kind, bytes FROM entries ORDER BY last_access"):
                if total <= budget_bytes:
                    break
                victims.append((key, kind))
                total -= size
            db.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k, _ in victims])
            _add(db, {"evictions": len(victims)})
        return victims

    def stats(self) -> dict[str, int]:
        """hits, misses, blocks, bytes, evictions, corrupt."""
        with self._db() as db:
            out = dict(db.execute("SELECT name, value FROM counters"))
            blocks, total = db.execute(
                "SELECT COUNT(*) FILTER (WHERE kind = 'block'), COALESCE(SUM(bytes), 0) FROM entries"
            ).fetchone()
        return {"hits": out["hits"], "misses": out["misses"], "blocks": blocks, "bytes": total,
                "evictions": out["evictions"], "corrupt": out["corrupt"]}


def _add(db: sqlite3.Connection, deltas: dict[str, int]) -> None:
    for name, delta in deltas.items():
        if delta:
            db.execute("UPDATE counters SET value = value + ? WHERE name = ?", (delta, name))
