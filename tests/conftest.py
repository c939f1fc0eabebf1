"""Shared fixtures: where converted real models live, and THE environment of an isolated kvnotes.

Every test that needs a database, a broker or a data folder gets them from `kvnotes_env` (the
variables) applied by the `isolated` fixture (this process) or handed to a subprocess (a worker,
the served app). Converted real models live in `<repo>/var/test-data` so later runs reuse them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Where the bundled real models are converted once: `<repo>/var/test-data`, kept between runs."""
    path = REPO / "var" / "test-data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def kvnotes_env(data: Path, broker_url: str | None = None, **overrides: str) -> dict[str, str]:
    """The variables of a kvnotes that keeps everything under `data`: its data folder, SQLite
    database, the embedded SQLite broker (or `broker_url`) and the result backend."""
    return {
        "KVNOTES_DATA": str(data),
        "DATABASE_URL": f"sqlite:///{data}/kvnotes.db",
        "BROKER_URL": broker_url or f"sqla+sqlite:///{data}/broker.db",
        "RESULT_BACKEND": f"db+sqlite:///{data}/results.db",
        **overrides,
    }


def reset_caches() -> None:
    """Forget settings, database engines and the Celery client so the next use reads the environment."""
    from data.db import reset_engines
    from data.queue import reset_celery
    from data.settings import get_settings

    get_settings.cache_clear()
    reset_engines()
    reset_celery()


@contextmanager
def applied(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`env` set in this process (caches reset) for the block; the previous environment after."""
    saved = dict(os.environ)
    os.environ.update(env)
    reset_caches()
    try:
        yield env
    finally:
        os.environ.clear()
        os.environ.update(saved)
        reset_caches()


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, small tmpfs mounted at `path` (root only; the test is skipped elsewhere): a disk that
    fills up."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def isolated(tmp_path: Path) -> Iterator[Callable[..., dict[str, str]]]:
    """`isolated(broker_url=None, **overrides)` points this process at a fresh kvnotes under
    `tmp_path` (see `kvnotes_env`) and returns its variables; undone after the test."""
    stack: list = []

    def apply(broker_url: str | None = None, **overrides: str) -> dict[str, str]:
        context = applied(kvnotes_env(tmp_path, broker_url, **overrides))
        stack.append(context)
        return context.__enter__()

    yield apply
    for context in reversed(stack):
        context.__exit__(None, None, None)


@pytest.fixture
def make_client(isolated):
    """`make_client(broker_url=None, **overrides)`: a FastAPI TestClient on a fresh, migrated SQLite
    database, with the embedded SQLAlchemy broker beside it (or `broker_url`, e.g. an unreachable
    one) and any other variables (`KVNOTES_AUTH="required"`, limits). It talks to the app as a
    loopback client of the loopback default (no sign-in), unless `KVNOTES_AUTH=required`."""
    from fastapi.testclient import TestClient

    clients: list[TestClient] = []

    def build(broker_url: str | None = None, **overrides: str) -> TestClient:
        isolated(broker_url, KVNOTES_BROKER_TIMEOUT="1", **overrides)
        from app.main import create_app
        from data.migrate import upgrade_to_head

        upgrade_to_head()
        # a loopback client of the loopback default: no sign-in, like `scripts/run.sh`
        client = TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()
