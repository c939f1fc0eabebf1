"""A storage fault at the end of a run keeps the run's results (issue 41): the worker's success write
(results and `succeeded` in one transaction, `worker.run_rows.succeed`) is held by storage that
cannot be written for 15 s, and lands once it can. SQLite: the database (and its WAL, in WAL mode)
made immutable (`chattr +i`; not `-shm`, whose loss under a mapping is a SIGBUS, a fault of its
own); PostgreSQL: the database made read-only (`default_transaction_read_only`, its sessions ended
so that every connection opens read-only). Where `chattr +i` does not bind: a failure under
`CI=true`, else skipped, saying why."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, func, select, text

from data.models import Run, RunResult, RunStatus
from tests.conftest import PG_ADMIN_URL, migrate
from tests.data.conftest import SNAPSHOT
from tests.worker.conftest import _chattr, _immutable_flag_binds

FAULT_S = 15.0
WORKER = "kvnotes-tiny-llama-fault@host"


def _running_run() -> int:
    from data.db import get_sessionmaker

    now = datetime.now(UTC)
    with get_sessionmaker()() as s:
        run = Run(snapshot=SNAPSHOT, strategies=["recompute", "stale"], status=RunStatus.RUNNING,
                  stage="engine", worker=WORKER, started_at=now, heartbeat_at=now, timings={}, attempts=1)
        s.add(run)
        s.commit()
        return run.id


def _succeed_through(fault_on, fault_off) -> None:
    """Start the fault, write the success in a worker thread, lift the fault after `FAULT_S`: the
    write was held (still trying) and then landed with every result."""
    from data.db import get_sessionmaker
    from worker import run_rows

    run_id = _running_run()
    rows = [RunResult(run_id=run_id, strategy=name, decision="yes", choice_probs={"yes": 0.8})
            for name in ("recompute", "stale")]
    done: dict = {}
    fault_on()
    try:
        writer = threading.Thread(target=lambda: done.update(ok=run_rows.succeed(
            run_id, WORKER, rows, {"engine_ms": 12.0})))
        writer.start()
        time.sleep(FAULT_S)
        assert writer.is_alive() and not done, done  # the write could not land: it is still trying
    finally:
        fault_off()
    writer.join(timeout=150)
    assert done == {"ok": True}
    with get_sessionmaker()() as s:
        run = s.get(Run, run_id)
        results = s.scalar(select(func.count(RunResult.id)).where(RunResult.run_id == run_id))
        assert (run.status, run.progress, results) == (RunStatus.SUCCEEDED, 1.0, 2)
        assert run.timings["engine_ms"] == 12.0


def test_read_only_sqlite_at_the_success_write_keeps_the_results(isolated, tmp_path: Path) -> None:
    _immutable_flag_binds(tmp_path)
    isolated(KVNOTES_MODELS=SNAPSHOT.model)
    migrate()
    from data.db import get_sessionmaker

    with get_sessionmaker()() as s:  # a pooled connection keeps the WAL file there, in WAL mode
        s.execute(text("SELECT 1"))
    files = [f for f in (tmp_path / "kvnotes.db", tmp_path / "kvnotes.db-wal") if f.exists()]
    _succeed_through(lambda: _chattr("+i", *files), lambda: _chattr("-i", *files))


def test_read_only_postgresql_at_the_success_write_keeps_the_results(isolated, postgres_url: str) -> None:
    isolated(KVNOTES_MODELS=SNAPSHOT.model, DATABASE_URL=postgres_url)
    migrate()
    name = postgres_url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")

    def read_only(on: bool) -> None:
        with admin.connect() as c:
            setting = ("SET default_transaction_read_only = on" if on
                       else "RESET default_transaction_read_only")
            c.execute(text(f'ALTER DATABASE "{name}" {setting}'))
            c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})

    try:
        _succeed_through(lambda: read_only(True), lambda: read_only(False))
    finally:
        admin.dispose()
