"""Shared fixtures. Converted real models live in `<repo>/var/test-data` so later runs reuse them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data folder for tests (`KVNOTES_DATA`): `<repo>/var/test-data`, kept between runs."""
    path = REPO / "var" / "test-data"
    path.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("KVNOTES_DATA")
    os.environ["KVNOTES_DATA"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("KVNOTES_DATA", None)
    else:
        os.environ["KVNOTES_DATA"] = previous


# --- the web app against a temporary database and a real broker (tests/test_api.py) ------------


def _reset_app_caches() -> None:
    """Forget settings, engines and the Celery client so the next use reads the environment."""
    from app.db import reset_engines
    from app.queue import reset_celery
    from app.settings import get_settings

    get_settings.cache_clear()
    reset_engines()
    reset_celery()


@pytest.fixture
def make_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Build a FastAPI TestClient on a fresh, migrated SQLite database under `tmp_path`, with the
    embedded SQLAlchemy broker there too (or `broker_url` when given, e.g. an unreachable one)."""
    from fastapi.testclient import TestClient

    clients: list[TestClient] = []

    def build(broker_url: str | None = None) -> TestClient:
        monkeypatch.setenv("KVNOTES_DATA", str(tmp_path))
        monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/kvnotes.db")
        monkeypatch.setenv("BROKER_URL", broker_url or f"sqla+sqlite:///{tmp_path}/broker.db")
        monkeypatch.setenv("RESULT_BACKEND", f"db+sqlite:///{tmp_path}/results.db")
        monkeypatch.setenv("KVNOTES_BROKER_TIMEOUT", "1")
        _reset_app_caches()
        from app.main import create_app
        from app.migrate import upgrade_to_head

        upgrade_to_head()
        client = TestClient(create_app())
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()
    monkeypatch.undo()
    _reset_app_caches()
