"""Deletes that race end in 204 or 404, never a 5xx (issue 41: `DELETE /api/notebooks/{n}` together
with `DELETE /api/fields/{f}` gave 21 x 500 in 40 rounds, `touch(field.notebook)` reading a notebook
deleted meanwhile). A served app (uvicorn, its thread pool) on SQLite and on PostgreSQL; each round
makes a notebook with a field and an erratum, then deletes the notebook, the field and the erratum
at once from three clients released together."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServedApp

ROUNDS = 40
DOC = "Customer record. status: active. age: 34. Only active customers may log in."


def _round(client: httpx.Client, clients: list[httpx.Client]) -> list[tuple[str, int]]:
    nb = client.post("/api/notebooks", json={"title": "race", "model": "smollm2-135m", "text": DOC}).json()
    at = DOC.index("active")
    field = client.post(f"/api/notebooks/{nb['id']}/fields",
                        json={"start": at, "end": at + 6, "new_value": "suspended", "label": "status"})
    erratum = client.post(f"/api/notebooks/{nb['id']}/errata", json={"text": "[NOTE] by hand"})
    assert field.status_code == 201 and erratum.status_code == 201, (field.text, erratum.text)
    targets = [("notebook", f"/api/notebooks/{nb['id']}"), ("field", f"/api/fields/{field.json()['id']}"),
               ("erratum", f"/api/errata/{erratum.json()['id']}")]
    start = threading.Barrier(len(targets))
    answers: list[tuple[str, int]] = []

    def delete(who: httpx.Client, what: str, path: str) -> None:
        start.wait()
        answers.append((what, who.delete(path).status_code))

    threads = [threading.Thread(target=delete, args=(who, what, path))
               for who, (what, path) in zip(clients, targets, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.get(f"/api/fields/{field.json()['id']}").status_code == 404
    return answers


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_notebook_and_its_parts_deleted_at_once_end_in_204_or_404(tmp_path: Path, database: str,
                                                                    request) -> None:
    overrides = {"DATABASE_URL": request.getfixturevalue("postgres_url")} if database == "postgresql" else {}
    with ServedApp(tmp_path, **overrides) as app:
        clients = [httpx.Client(base_url=app.url, timeout=30) for _ in range(4)]
        try:
            answers = [a for _ in range(ROUNDS) for a in _round(clients[0], clients[1:])]
        finally:
            for client in clients:
                client.close()
    counts = Counter(answers)
    assert {status for _, status in counts} <= {204, 404}, counts
    assert counts[("notebook", 204)] == ROUNDS  # the notebook's delete always wins or waits: never refused
