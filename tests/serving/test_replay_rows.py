"""Replays in the API without a server: what is refused before any server is asked (no URL, no
field, no question: 422 naming it, nothing saved), and a replay whose worker never finished it
reads as failed with the reason, never as `running` forever."""

from __future__ import annotations

from datetime import timedelta

from data.models import utcnow
from data.replays import Replay
from vocabulary.replay import ReplaySpec

DOC = "SHIPMENT\ndestination: Oslo\ncarrier: NordFreight\n"


def _notebook(client) -> int:
    r = client.post("/api/notebooks", json={"title": "s", "model": "smollm2-135m", "text": DOC})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_replay_needs_a_server_a_field_and_a_question(make_client):
    client = make_client()
    nid = _notebook(client)
    r = client.post(f"/api/notebooks/{nid}/replays", json={})
    assert r.status_code == 422 and "no vLLM server is configured: the operator sets KVNOTES_VLLM_URL" \
        in r.text
    url = {"url": "http://127.0.0.1:9/v1"}
    r = client.post(f"/api/notebooks/{nid}/replays", json=url)
    assert r.status_code == 422 and "this notebook has no field to replay" in r.text
    start = DOC.index("Oslo")
    client.post(f"/api/notebooks/{nid}/fields", json={"start": start, "end": start + 4, "new_value": "Rome"})
    r = client.post(f"/api/notebooks/{nid}/replays", json={**url, "field_id": 999})
    assert r.status_code == 422 and "field 999 is not in this notebook" in r.text
    r = client.post(f"/api/notebooks/{nid}/replays", json=url)
    assert r.status_code == 422 and "this notebook has no question yet" in r.text
    client.put(f"/api/notebooks/{nid}/question", json={"text": "Where?"})
    r = client.post(f"/api/notebooks/{nid}/replays", json=url)
    assert r.status_code == 422 and "the server at http://127.0.0.1:9 did not answer as vLLM does" in r.text
    assert client.get(f"/api/notebooks/{nid}/replays").json() == []


def test_a_replay_silent_past_the_heartbeat_age_or_queued_past_the_time_limit_is_reaped(make_client):
    """The one reaper (never a read) fails a running replay whose heartbeat is older than
    `KVNOTES_HEARTBEAT_MAX_AGE` and a queued one never taken within the time limit + 60 s."""
    client = make_client(KVNOTES_TASK_TIME_LIMIT="60")
    nid = _notebook(client)
    from data.db import get_sessionmaker

    snapshot = ReplaySpec(url="http://127.0.0.1:9", document=DOC, start=21, end=25, label="destination",
                          values=("Rome",), question="Where?")
    from data.watchdog import reap

    with get_sessionmaker()() as s:
        running = {"notebook_id": nid, "snapshot": snapshot, "status": "running", "stage": "in_place: 1/3",
                   "progress": 0.3}
        silent = Replay(**running, heartbeat_at=utcnow() - timedelta(seconds=121))
        fresh = Replay(**running, heartbeat_at=utcnow())
        queued = Replay(notebook_id=nid, snapshot=snapshot, status="queued", stage="queued",
                        created_at=utcnow() - timedelta(seconds=121))
        s.add_all([silent, fresh, queued])
        s.commit()
        silent_id, fresh_id, queued_id = silent.id, fresh.id, queued.id
    assert client.get(f"/api/replays/{silent_id}").json()["status"] == "running"  # a read writes nothing
    with get_sessionmaker()() as s:
        assert sorted(reap(s).ids["replay"]) == [silent_id, queued_id]
    read = client.get(f"/api/replays/{silent_id}").json()
    assert read["status"] == "failed" and read["error"] == "worker lost while running; re-run it"
    assert client.get(f"/api/replays/{fresh_id}").json()["status"] == "running"
    read = client.get(f"/api/replays/{queued_id}").json()
    assert read["status"] == "failed" and "did not finish within 120 s" in read["error"]
    assert "did not finish within 120 s" in client.get(f"/replays/{queued_id}").text


def test_a_queued_or_running_replay_can_be_cancelled_once(make_client):
    client = make_client()
    nid = _notebook(client)
    from data.db import get_sessionmaker

    snapshot = ReplaySpec(url="http://127.0.0.1:9", document=DOC, start=21, end=25, label="destination",
                          values=("Rome",), question="Where?")
    with get_sessionmaker()() as s:
        rows = [Replay(notebook_id=nid, snapshot=snapshot, status=status, stage=status, progress=0.0)
                for status in ("queued", "running", "succeeded")]
        s.add_all(rows)
        s.commit()
        queued, running, done = (r.id for r in rows)
    box = client.get(f"/replays/{running}/panel").text
    assert f'hx-post="/replays/{running}/cancel"' in box and ">Cancel</button>" in box
    r = client.post(f"/api/replays/{queued}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["finished_at"]
    box = client.post(f"/replays/{running}/cancel").text  # the panel's button
    assert "Cancelled: no more requests were sent" in box and ">Cancel</button>" not in box
    assert "hx-trigger" not in box  # no more polling
    for rid, status in ((queued, "cancelled"), (running, "cancelled"), (done, "succeeded")):
        again = client.post(f"/api/replays/{rid}/cancel")
        assert again.status_code == 409 and f"replay {rid} already {status}" in again.text
    assert client.post("/api/replays/987654/cancel").status_code == 404
