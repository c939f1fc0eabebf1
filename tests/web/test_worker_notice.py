"""A queued run says on the page when no live worker serves its model, and stops saying it once one
registers (the worker registry, `data.workers`)."""

from __future__ import annotations

DOC = "Account record\n\nstatus: active\n\nOnly accounts whose status is active may log in."


def test_a_queued_run_says_when_no_worker_serves_its_model(make_client) -> None:
    client = make_client()
    nb = client.post("/api/notebooks", json={"title": "t", "text": DOC}).json()["id"]
    run = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).json()
    page = client.get(f"/runs/{run['id']}/progress").text
    assert "No live worker serves <code>smollm2-135m</code>" in page
    from data import workers
    from data.db import get_sessionmaker
    from data.queue import queue_for

    with get_sessionmaker()() as session:
        workers.register(session, "kvnotes-smollm2-135m-abc123@host", [queue_for("smollm2-135m")], "host", 1)
        session.commit()
    page = client.get(f"/runs/{run['id']}/progress").text
    assert "No live worker" not in page and "Waiting for a worker that holds" in page
