"""What the API tests share: a policy document, a notebook made through the API, and the messages
waiting in the embedded broker."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

DOC = "Customer record. status: active. age: 34. Only active customers may log in."
@pytest.fixture
def engines_without_store():
    """For a test that runs the real worker tasks in this process: they attach the process's KV
    store to the engine `load` caches per process, and later tests that load the same model expect
    none (their prefill computed, not read back: tests/engine/test_cuda_path.py and
    test_device_map.py failed after such a test), so it is taken off again."""
    yield
    import sys

    engine_module = sys.modules.get("worker.engine.engine")
    for engine in getattr(engine_module, "_ENGINES", {}).values():
        engine.store = None


def _counts() -> tuple[int, int]:
    """How many sweeps and runs the database holds (a refused request must add neither)."""
    from sqlalchemy import func, select

    from data.db import get_sessionmaker
    from data.models import Run, Sweep

    with get_sessionmaker()() as s:
        return s.scalar(select(func.count(Sweep.id))), s.scalar(select(func.count(Run.id)))


def _notebook(client: TestClient, text: str = DOC) -> dict:
    r = client.post("/api/notebooks", json={"title": "policy", "model": "smollm2-135m", "text": text})
    assert r.status_code == 201, r.text
    return r.json()


def _broker_messages(tmp_path: Path) -> list[tuple[str, dict]]:
    """(queue name, message headers + kwargs) for every message waiting in the embedded broker (none
    while kombu has not made its tables: the app creates broker.db empty, 0600, before kombu opens it)."""
    with sqlite3.connect(tmp_path / "broker.db") as db:
        made = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kombu_message'")
        if made.fetchone() is None:
            return []
        rows = db.execute(
            "SELECT q.name, m.payload FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id"
        ).fetchall()
    out = []
    for queue, payload in rows:
        message = json.loads(payload)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append((queue, {"task": message["headers"]["task"], "id": message["headers"]["id"], **kwargs}))
    return out
