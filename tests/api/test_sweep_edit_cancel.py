"""Cancelling a queued sweep edit through `/api/runs/{id}/cancel` frees the sweep's slot once its
other edits end, whichever ends last (issue 41): the sweep is refreshed whenever one of its edits
ends, cancel included. On SQLite and PostgreSQL, 10 rounds of each order, with the real API and the
worker's own claim, success write and sweep refresh (no Celery process: the edit that runs is
written by the functions `kvnotes.run` calls)."""

from __future__ import annotations

import pytest

from tests.api.conftest import DOC, _notebook

ROUNDS = 10
HOST = "kvnotes-smollm2-135m-test@host"


@pytest.fixture(params=["sqlite", "postgresql"])
def client(request, make_client):
    overrides = {"KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER": "1"}
    if request.param == "postgresql":
        overrides["DATABASE_URL"] = request.getfixturevalue("postgres_url")
    return make_client(**overrides)


def _sweep(client, nb: int) -> dict:
    r = client.post(f"/api/notebooks/{nb}/sweeps", json={
        "question": "Can this customer log in?", "choices": ["yes", "no"], "strategies": ["recompute"],
        "values": {"status": ["banned", "suspended"]}})
    assert r.status_code == 201, r.text
    return r.json()


def _run_to_success(run_id: int) -> None:
    """What `kvnotes.run` writes for an edit that runs: the claim, the results, the sweep's refresh."""
    from data.db import get_sessionmaker
    from data.models import Run, RunResult
    from worker import run_rows, sweep_rows

    with get_sessionmaker()() as s:
        token = s.get(Run, run_id).task_id
    snapshot = run_rows.claim(run_id, HOST, token)
    assert snapshot is not None
    rows = [RunResult(run_id=run_id, strategy="recompute", decision="no", choice_probs={"no": 0.9})]
    assert run_rows.succeed(run_id, HOST, rows, {"engine_ms": 1.0})
    sweep_rows.refresh(snapshot.sweep_id)


def _drop_message(run_id: int, sweep_id: int) -> None:
    """The cancelled edit's message reaches a worker: dropped at the claim, its sweep refreshed."""
    from data.db import get_sessionmaker
    from data.models import Run
    from worker import run_rows, sweep_rows

    with get_sessionmaker()() as s:
        token = s.get(Run, run_id).task_id
    assert run_rows.claim(run_id, HOST, token) is None
    sweep_rows.refresh(sweep_id)


def test_a_cancelled_queued_edit_frees_the_sweeps_slot_once_the_others_end(client) -> None:
    start = DOC.index("active")
    nb = _notebook(client)["id"]
    r = client.post(f"/api/notebooks/{nb}/fields",
                    json={"start": start, "end": start + 6, "new_value": "banned", "label": "status"})
    assert r.status_code == 201, r.text
    for round_ in range(ROUNDS):
        sweep = _sweep(client, nb)
        first, second = (e["run_id"] for e in sweep["edits"])
        blocked = client.post(f"/api/notebooks/{nb}/sweeps", json={"question": "q?", "values": {
            "status": ["closed"]}, "strategies": ["recompute"]})
        assert blocked.status_code == 429, blocked.text  # one sweep at a time: the slot is taken
        cancelled, ran = (first, second) if round_ % 2 == 0 else (second, first)
        if round_ % 4 < 2:  # the cancel first, then the other edit ends
            assert client.post(f"/api/runs/{cancelled}/cancel").json()["status"] == "cancelled"
            _drop_message(cancelled, sweep["id"])
            assert client.get(f"/api/sweeps/{sweep['id']}").json()["status"] in ("queued", "running")
            _run_to_success(ran)
        else:  # the other edit ends first, then the last queued one is cancelled: that ends the sweep
            _run_to_success(ran)
            assert client.get(f"/api/sweeps/{sweep['id']}").json()["status"] in ("queued", "running")
            assert client.post(f"/api/runs/{cancelled}/cancel").json()["status"] == "cancelled"
        view = client.get(f"/api/sweeps/{sweep['id']}").json()
        assert (view["status"], view["edits_done"]) == ("succeeded", 1), view
        assert client.post(f"/api/runs/{cancelled}/cancel").status_code == 409  # finished: told so
    last = _sweep(client, nb)  # the slot is free again
    assert client.post(f"/api/sweeps/{last['id']}/cancel").json()["status"] == "cancelled"
