"""Storage that takes the database's files away kills no process (issue 41, item 8): with WAL, a
`-shm` made immutable (`chattr +i`) killed web processes and workers with SIGBUS (ext4 answers a
write to an immutable file's mapped page so), and requests in flight lost their connection. SQLite
now keeps the rollback journal and maps nothing (`data.db`), so there is no `-shm` to take away.

A served app (uvicorn) and a Celery worker (the replays' worker: it beats into the database every
few seconds) over SQLite; three times, every file of the database there is (the database, and a
`-shm`, `-wal` or journal if one exists) immutable for 15 s while one keep-alive client reads and
writes without pause: no process dies, no connection drops, every answer is 200, 201 or 503 (some
503s: the fault bit), and writes come back after `chattr -i`. Where `chattr +i` does not bind (not
root, a file system without the flag): a failure under `CI=true`, else skipped. With
`KVNOTES_SQLITE_JOURNAL=wal` the same first episode kills the web process (checked by hand: see
docs/load.md)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServedApp
from tests.worker.conftest import _chattr, _immutable_flag_binds

pytestmark = pytest.mark.slow
EPISODES, FAULT_S = 3, 15.0
DOC = "Customer record. status: active. age: 34. Only active customers may log in."


def _ask(client: httpx.Client, i: int, seen: Counter) -> None:
    """A read and a write; a dropped connection is counted as its exception's name."""
    for method, path, body in (("GET", "/api/notebooks", None),
                               ("POST", "/api/notebooks", {"title": f"n{i}", "text": DOC})):
        try:
            seen[client.request(method, path, json=body).status_code] += 1
        except httpx.TransportError as exc:
            seen[type(exc).__name__] += 1


def test_database_files_immutable_for_15_s_three_times_kill_no_process(tmp_path: Path) -> None:
    _immutable_flag_binds(tmp_path)
    with ServedApp(tmp_path, replays=True) as app:
        client = httpx.Client(base_url=app.url, timeout=30)
        assert client.post("/api/notebooks", json={"title": "before", "text": DOC}).status_code == 201
        assert not (tmp_path / "kvnotes.db-shm").exists()  # nothing of it is memory-mapped
        during: Counter = Counter()
        after: Counter = Counter()
        try:
            for episode in range(EPISODES):
                files = [p for p in tmp_path.glob("kvnotes.db*") if p.is_file()]
                assert _chattr("+i", *files).returncode == 0
                t0, i = time.monotonic(), 0
                while time.monotonic() - t0 < FAULT_S:
                    _ask(client, i, during)
                    i += 1
                    time.sleep(0.2)
                assert _chattr("-i", *files).returncode == 0
                t_back = time.monotonic()
                again = {"title": f"after {episode}", "text": DOC}
                while client.post("/api/notebooks", json=again).status_code != 201:
                    assert time.monotonic() - t_back < 30, "writes did not come back"
                    time.sleep(0.5)
                _ask(client, i, after)
                assert [p.poll() for p in app.procs] == [None] * len(app.procs), app.log.read_text()[-3000:]
        finally:
            _chattr("-i", *tmp_path.glob("kvnotes.db*"))
        print(f"\nduring {EPISODES} x {FAULT_S:g} s of immutable database files: {dict(during)}; "
              f"after: {dict(after)}")
        assert set(during) <= {200, 201, 503} and during[503] > 0, during
        assert set(after) == {200, 201}, after
        titles = [n["title"] for n in client.get("/api/notebooks", params={"limit": 200}).json()]
        assert "before" in titles and all(f"after {e}" in titles for e in range(EPISODES))


def test_a_database_left_in_wal_goes_back_to_the_rollback_journal_when_opened_alone(isolated,
                                                                                    tmp_path) -> None:
    """WAL persists in the file: an installation from before leaves it on, until a connection alone on
    the file (`kvnotes serve` migrating, before it starts anything) turns it back; beside another
    process's connection it stays in WAL, without waiting, and the app works on."""
    import sqlite3

    from sqlalchemy import text

    from data.db import get_engine

    isolated()
    path = tmp_path / "kvnotes.db"
    other = sqlite3.connect(path)
    assert other.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    other.execute("CREATE TABLE t (x)")
    other.commit()
    with get_engine().connect() as connection:  # another connection holds the file: stays WAL
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    get_engine().dispose()
    other.close()
    with get_engine().connect() as connection:  # alone now
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "delete"
    get_engine().dispose()
    assert not (tmp_path / "kvnotes.db-shm").exists() and not (tmp_path / "kvnotes.db-wal").exists()
