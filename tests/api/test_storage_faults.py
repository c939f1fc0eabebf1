"""A database that cannot be written — read-only SQLite, a full disk, a read-only PostgreSQL — gives
a plain 503 (never the SQL, never a bare 500), saves nothing half-way, keeps reads working, and
shows in /api/health as "not writable"; when the fault goes, writes work again without a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from tests.conftest import PG_ADMIN_URL, applied, kvnotes_env, migrate, tmpfs

DOC = "Customer record. status: active. Only active customers may log in."
# the statement, not the reason
SQL_WORDS = ("INSERT INTO", "UPDATE notebooks", "VALUES", "SELECT ", "[SQL", "[parameters")


def _client() -> TestClient:
    from app.main import create_app

    return TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))


def _assert_plain_503(r, reason: str) -> None:
    assert r.status_code == 503, r.text
    assert reason in r.text and "nothing was saved" in r.text
    assert not any(word in r.text for word in SQL_WORDS), r.text


def test_a_read_only_sqlite_database(tmp_path: Path) -> None:
    env = kvnotes_env(tmp_path)
    with applied(env):
        migrate()
        client = _client()
        nb = client.post("/api/notebooks", json={"title": "t", "text": DOC}).json()["id"]
    read_only = f"sqlite:///file:{tmp_path}/kvnotes.db?mode=ro&uri=true"
    with applied({**env, "DATABASE_URL": read_only}):
        client = _client()
        _assert_plain_503(client.post("/api/notebooks", json={"title": "t", "text": DOC}),
                          "readonly database")
        page = client.post("/notebooks", data={"title": "t", "model": "smollm2-135m", "text": DOC})
        assert page.status_code == 503 and "readonly database" in page.text and "INSERT INTO" not in page.text
        assert client.get(f"/api/notebooks/{nb}").status_code == 200  # reads still work
        assert client.get(f"/notebooks/{nb}").status_code == 200
        health = client.get("/api/health")
        assert (health.status_code == 503
                and health.json()["database"].startswith("not writable: attempt to write"))
    with applied(env):
        assert [n["id"] for n in _client().get("/api/notebooks").json()] == [nb]  # nothing half-saved


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 4 MiB tmpfs (root only): a real disk that fills up."""
    with tmpfs(tmp_path / "disk", "4m") as mount:
        yield mount


def test_a_full_disk(tiny_disk: Path) -> None:
    env = kvnotes_env(tiny_disk)
    with applied(env):
        migrate()
        client = _client()
        assert client.post("/api/notebooks", json={"title": "before", "text": DOC}).status_code == 201
        filler = tiny_disk / "filler"
        with filler.open("wb", buffering=0) as f:
            try:
                while f.write(b"\0" * 4096):
                    pass
            except OSError:
                pass
        r = client.post("/api/notebooks", json={"title": "t", "text": "x" * 150_000})
        _assert_plain_503(r, "full")
        health = client.get("/api/health")
        assert health.status_code == 503 and "not writable" in health.json()["database"]
        filler.unlink()
        assert client.post("/api/notebooks", json={"title": "after", "text": DOC}).status_code == 201
        assert [n["title"] for n in client.get("/api/notebooks").json()] == ["after", "before"]


def test_a_read_only_postgresql_database(tmp_path: Path, postgres_url: str) -> None:
    env = kvnotes_env(tmp_path, DATABASE_URL=postgres_url)
    name = postgres_url.rsplit("/", 1)[1]
    with applied(env):
        migrate()
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'))
        from data.db import reset_engines

        reset_engines()  # new connections: read-only from now on
        client = _client()
        _assert_plain_503(client.post("/api/notebooks", json={"title": "t", "text": DOC}),
                          "read-only transaction")
        assert client.get("/api/notebooks").status_code == 200
        assert "read-only" in client.get("/api/health").json()["database"]
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off'))
        reset_engines()
        assert client.post("/api/notebooks", json={"title": "t", "text": DOC}).status_code == 201
        admin.dispose()
        reset_engines()
