"""`GET /api/health` writes nothing (issue 41): it is public and exempt from the request limiter.
1,000 requests on SQLite and on PostgreSQL leave the liveness row as it was and move none of the
database's write counters (SQLite: `PRAGMA data_version` seen from another connection, the size of
the database and of its WAL; PostgreSQL: `pg_stat_database`'s rows inserted, updated, deleted). The
liveness row is the workers' beat's to write, and health reads it: a live worker of this machine
whose beat has not landed for 30 s makes the database "not writable"."""

from __future__ import annotations

import os
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, text

REQUESTS = 1000


def _probe_rows() -> list[tuple]:
    from data.db import get_sessionmaker

    with get_sessionmaker()() as s:
        return [tuple(r) for r in s.execute(text("SELECT id, checked_at FROM health_probe ORDER BY id"))]


def _hammer(client) -> None:
    for _ in range(REQUESTS):
        r = client.get("/api/health")
        assert r.status_code in (200, 503) and r.json()["database"] == "ok", r.text


def test_a_thousand_health_reads_write_nothing_on_sqlite(make_client, tmp_path: Path) -> None:
    client = make_client()
    client.get("/api/health")  # the first request makes the broker's own tables (in broker.db)
    db = tmp_path / "kvnotes.db"
    observer = sqlite3.connect(db)
    version = observer.execute("PRAGMA data_version").fetchone()[0]
    sizes = [os.path.getsize(p) if p.exists() else 0 for p in (db, Path(f"{db}-wal"))]
    rows = _probe_rows()
    _hammer(client)
    assert observer.execute("PRAGMA data_version").fetchone()[0] == version  # no commit by another connection
    assert [os.path.getsize(p) if p.exists() else 0 for p in (db, Path(f"{db}-wal"))] == sizes
    assert _probe_rows() == rows
    observer.close()


def test_a_thousand_health_reads_write_nothing_on_postgresql(make_client, postgres_url: str) -> None:
    from data.db import release_connections

    client = make_client(DATABASE_URL=postgres_url)
    client.get("/api/health")
    name = postgres_url.rsplit("/", 1)[1]
    observer = create_engine(postgres_url, isolation_level="AUTOCOMMIT")

    def written() -> tuple[int, int, int]:
        release_connections()  # a backend reports its counters when it ends
        with observer.connect() as c:
            c.execute(text("SELECT pg_stat_force_next_flush()"))
            c.execute(text("SELECT pg_stat_clear_snapshot()"))
            return tuple(c.execute(text("SELECT tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
                                        "WHERE datname = :n"), {"n": name}).one())

    before, rows = written(), _probe_rows()
    _hammer(client)
    assert written() == before
    assert _probe_rows() == rows
    observer.dispose()


def test_health_reads_the_liveness_row_the_beat_writes(make_client) -> None:
    from data import workers
    from data.db import get_sessionmaker
    from data.health import LIVENESS_STALE_S, HealthProbe, write_liveness

    client = make_client()
    assert client.get("/api/health").json()["database"] == "ok"  # no worker beats here: nothing to judge
    import socket

    with get_sessionmaker()() as s:  # a live worker of this machine (this process) ...
        workers.register(s, "kvnotes-beat@h", ["model.smollm2-135m"], socket.gethostname(), os.getpid())
        write_liveness(s)
        s.commit()
    assert client.get("/api/health").json()["database"] == "ok"
    with get_sessionmaker()() as s:  # ... whose beat has not landed for longer than the limit
        late = datetime.now(UTC) - timedelta(seconds=LIVENESS_STALE_S + 5)
        s.get(HealthProbe, 1).checked_at = s.get(workers.Worker, "kvnotes-beat@h").beat_at = late
        s.commit()
    database = client.get("/api/health").json()["database"]
    assert database.startswith("not writable: the workers' beat has not been written"), database
    with get_sessionmaker()() as s:  # the beat lands again
        workers.beat(s, "kvnotes-beat@h")
        write_liveness(s)
        s.commit()
    assert client.get("/api/health").json()["database"] == "ok"
