"""Replays in the API without a server: what is refused before any server is asked (no URL, no
field, no question: 422 naming it, nothing saved), and a replay whose worker never finished it
reads as failed with the reason, never as `running` forever."""

from __future__ import annotations

from datetime import timedelta

from data.models import as_utc, utcnow
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


def test_a_replay_silent_past_the_heartbeat_age_or_queued_past_its_deadline_is_reaped(make_client):
    """The one reaper (never a read) fails a running replay whose heartbeat is older than
    `KVNOTES_HEARTBEAT_MAX_AGE` and a queued one no worker touched within the replays' own deadline
    + 60 s (`KVNOTES_REPLAY_DEADLINE` 60 s here; the time limit, 30 s, is not a replay's: issue 49)."""
    client = make_client(KVNOTES_TASK_TIME_LIMIT="30", KVNOTES_REPLAY_DEADLINE="60")
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
        # past the time limit + 60 s, within the replays' deadline + 60 s: it waits on
        waiting = Replay(notebook_id=nid, snapshot=snapshot, status="queued", stage="queued",
                         created_at=utcnow() - timedelta(seconds=100))
        s.add_all([silent, fresh, queued, waiting])
        s.commit()
        silent_id, fresh_id, queued_id, waiting_id = silent.id, fresh.id, queued.id, waiting.id
    assert client.get(f"/api/replays/{silent_id}").json()["status"] == "running"  # a read writes nothing
    with get_sessionmaker()() as s:
        assert sorted(reap(s).ids["replay"]) == [silent_id, queued_id]
    read = client.get(f"/api/replays/{silent_id}").json()
    assert read["status"] == "failed" and read["error"] == "worker lost while running; re-run it"
    assert client.get(f"/api/replays/{fresh_id}").json()["status"] == "running"
    read = client.get(f"/api/replays/{queued_id}").json()
    said = "the replay waited 120 s (KVNOTES_REPLAY_DEADLINE + 60 s) and no worker took its message"
    assert read["status"] == "failed" and said in read["error"], read["error"]
    assert said in client.get(f"/replays/{queued_id}").text
    assert client.get(f"/api/replays/{waiting_id}").json()["status"] == "queued"


def test_a_replay_held_back_by_the_fair_share_is_never_reaped_as_untaken(make_client):
    """One thread (a share of one per user) held by the user: their next replay's message goes back
    (the task run in this process, as a worker runs it), and its row's heartbeat says a worker saw it
    (the database's clock). Created two hours ago, past any deadline, the reaper leaves it queued;
    before, it failed as "no worker took its message" (issue 49)."""
    client = make_client(KVNOTES_REPLAY_THREADS="1")
    nid = _notebook(client)
    from data.db import get_sessionmaker
    from data.watchdog import reap
    from worker.replay_task import fair_share, replay_task

    snapshot = ReplaySpec(url="http://127.0.0.1:9", document=DOC, start=21, end=25, label="destination",
                          values=("Rome",), question="Where?")
    with get_sessionmaker()() as s:
        held = Replay(notebook_id=nid, snapshot=snapshot, status="queued", stage="queued", task_id="t-held",
                      created_at=utcnow() - timedelta(hours=2))
        s.add(held)
        s.commit()
        held_id = held.id
    assert fair_share.take("")  # the user (no account here) already holds the one thread
    try:
        assert replay_task.apply(args=(held_id,), task_id="t-held").get()["status"] == "deferred"
    finally:
        fair_share.give_back("")
    with get_sessionmaker()() as s:
        row = s.get(Replay, held_id)
        assert row.heartbeat_at is not None and row.status == "queued"
        assert reap(s).ids.get("replay", []) == []
    assert client.get(f"/api/replays/{held_id}").json()["status"] == "queued"


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


def test_a_worker_whose_clock_is_an_hour_behind_keeps_its_replay(make_client, monkeypatch):
    """Heartbeats and the reaper on the database's clock (issue 49): a worker host whose clock is an
    hour behind (`datetime.now` there) claims a replay and beats; the reaper, on the database's
    clock, leaves it running. Before, the claim and the beat wrote the host's clock, and the reaper
    failed the job at once as "worker lost" (its heartbeat an hour old)."""
    import worker.jobs as jobs
    from data.db import get_sessionmaker
    from data.jobs import REPLAYS
    from data.watchdog import reap

    client = make_client()
    nid = _notebook(client)
    snapshot = ReplaySpec(url="http://127.0.0.1:9", document=DOC, start=21, end=25, label="destination",
                          values=("Rome",), question="Where?")
    with get_sessionmaker()() as s:
        row = Replay(notebook_id=nid, snapshot=snapshot, status="queued", stage="queued", task_id="t-skew")
        s.add(row)
        s.commit()
        replay_id = row.id
    monkeypatch.setattr(jobs, "now", lambda: utcnow() - timedelta(hours=1))  # the worker host's clock
    assert jobs.claim(REPLAYS, replay_id, "t-skew", "skewed@host", "starting") is not None
    assert jobs.write(Replay, replay_id, "skewed@host", stage="in_place: 1/3")
    with get_sessionmaker()() as s:
        assert reap(s).ids.get("replay", []) == []
        beat = s.get(Replay, replay_id).heartbeat_at
    assert client.get(f"/api/replays/{replay_id}").json()["status"] == "running"
    assert abs((utcnow() - as_utc(beat)).total_seconds()) < 60  # the database's clock (this machine's)
