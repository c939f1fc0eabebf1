"""A replay cannot be turned against the server (issue 24, findings 1-4), on real local sockets
and HTTP servers on 127.0.0.1 (no vLLM needed):

- addresses no replay may reach are refused before any connection; off the embedded default, only
  the servers the operator configured (`KVNOTES_VLLM_URL`) are reached;
- nothing a server says is quoted back, and every failure reads the same;
- eight replays aimed at a socket that never answers leave the app answering;
- a cancelled replay stops mid-stream, a replay has an overall deadline and each answer one;
- replays count against the runs' per-user cap, and a deleted replay's message is dropped at once.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving import Bounds, ReplayError, ReplaySpec, ReplayStopped, replay
from serving.server import base_url
from tests.conftest import ServedApp, free_port
from tests.serving.conftest import SilentSocket

DOC = "SHIPMENT\ndestination: Oslo\ncarrier: NordFreight\n"
START = DOC.index("Oslo")


def _notebook(client) -> int:
    """A notebook with a field (Oslo -> Rome) and a free-answer question."""
    r = client.post("/api/notebooks", json={"title": "s", "model": "smollm2-135m", "text": DOC})
    assert r.status_code == 201, r.text
    nid = r.json()["id"]
    field = {"start": START, "end": START + 4, "new_value": "Rome"}
    r = client.post(f"/api/notebooks/{nid}/fields", json=field)
    assert r.status_code == 201, r.text
    assert client.put(f"/api/notebooks/{nid}/question", json={"text": "Where?"}).status_code == 200
    return nid


def _spec(**kw) -> ReplaySpec:
    return ReplaySpec(DOC, START, START + 4, "destination", ("Rome", "Lisbon"), "Where?", **kw)


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:5432/v1", "port 5432 is a database's or a message broker's"),
    ("http://127.0.0.1:6379", "port 6379 is a database's or a message broker's"),
    ("http://169.254.169.254/latest", "link-local"),
    ("http://[::ffff:169.254.169.254]:8000", "link-local"),
    ("http://0.0.0.0:8000/v1", "unspecified"),
    ("http://[::]:8000/v1", "unspecified"),
    ("http://2130706433:8000/v1", "four decimal numbers"),
    ("http://127.1:8000/v1", "four decimal numbers"),
    ("http://user:pw@127.0.0.1:8000/v1", "must not carry a user name or password"),
    ("http://[::1]:8000/v1", "is IPv6's loopback address; a server on this machine is reached at 127.0.0.1"),
    ("http://[::2]:8000/v1", "a multicast or reserved address"),
])
def test_addresses_no_replay_may_reach_are_refused(make_client, url, says):
    client = make_client()
    nid = _notebook(client)
    r = client.post(f"/api/notebooks/{nid}/replays", json={"url": url})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "url"], r.text
    assert says in r.text, r.text
    assert client.get(f"/api/notebooks/{nid}/replays").json() == []


def test_the_apps_own_service_ports_are_refused_before_any_connection():
    """A port of the app's database or broker (here a listener standing in for one) is refused
    without a connection: the listener accepts nothing."""
    silent = SilentSocket()
    try:
        port = int(silent.url.rsplit(":", 1)[1])
        with pytest.raises(ReplayError, match=f"port {port} is a database's or a message broker's"):
            replay(_spec(), silent.url, bounds=Bounds(refused_ports=(port,)))
        time.sleep(0.2)
        assert silent.accepted == 0
    finally:
        silent.close()


def test_only_configured_servers_are_reached_off_the_embedded_default(make_client, fake_vllm):
    """With an account, the local user no longer names servers: only KVNOTES_VLLM_URL's."""
    configured, other = fake_vllm(), fake_vllm()
    client = make_client(KVNOTES_VLLM_URL=f"{configured.url}/v1, http://127.0.0.1:9/v1")
    nid = _notebook(client)
    free = client.post(f"/api/notebooks/{nid}/replays", json={"url": other.url})
    assert free.status_code == 201, free.text  # the embedded default with no account: the operator
    from data.accounts import add_user
    from data.db import get_sessionmaker

    with get_sessionmaker()() as s:
        add_user(s, "ana", "a long enough password")
        s.commit()
    r = client.post(f"/api/notebooks/{nid}/replays", json={"url": other.url})
    assert r.status_code == 422 and "only the vLLM servers this server's operator configured" in r.text
    assert f"{configured.url}/v1" in r.text
    assert client.post(f"/api/notebooks/{nid}/replays", json={"url": f"{configured.url}/"}).status_code == 201
    default = client.post(f"/api/notebooks/{nid}/replays", json={})
    assert default.status_code == 201 and default.json()["snapshot"]["url"] == configured.url


def test_a_replay_reads_back_whole_with_timestamps_in_utc(make_client, fake_vllm):
    """One spec (vocabulary.replay.ReplaySpec) from the request to the row and back: the server and
    the model it serves are kept (a dict between two declarations dropped them before), and every
    timestamp ends in Z as a run's do."""
    import dataclasses

    from vocabulary.replay import ReplaySpec

    server = fake_vllm()
    client = make_client()
    nid = _notebook(client)
    made = client.post(f"/api/notebooks/{nid}/replays", json={"url": f"{server.url}/v1", "rate": 2})
    assert made.status_code == 201, made.text
    read = client.get(f"/api/replays/{made.json()['id']}").json()
    assert set(read["snapshot"]) == {f.name for f in dataclasses.fields(ReplaySpec)}
    assert (read["snapshot"]["url"], read["snapshot"]["model"], read["snapshot"]["rate"]) == \
        (server.url, "fake-model", 2.0)
    assert read["created_at"].endswith("Z") and read["finished_at"] is None, read["created_at"]
    cancelled = client.post(f"/api/replays/{read['id']}/cancel").json()
    assert cancelled["finished_at"].endswith("Z") and cancelled["created_at"] == read["created_at"]


def test_no_server_body_is_quoted_and_every_failure_reads_the_same(make_client, fake_vllm):
    secret = fake_vllm("secret")
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens
    silent = SilentSocket()
    client = make_client()
    nid = _notebook(client)
    messages = []
    try:
        for url in (secret.url, refused, silent.url):
            r = client.post(f"/api/notebooks/{nid}/replays", json={"url": url})
            assert r.status_code == 422, r.text
            assert "INTERNAL-ONLY-TOKEN" not in r.text and "secret" not in r.text
            messages.append(r.json()["detail"][0]["msg"].replace(url, "URL"))
    finally:
        silent.close()
    assert messages[0] == messages[1] == messages[2] == \
        "the server at URL did not answer as vLLM does (GET /v1/models)", messages


def test_eight_replays_at_a_silent_socket_leave_the_app_answering(tmp_path):
    """Today each held a request slot for the socket's life and /login got 503. Now a check
    takes seconds at most, and only two run at once: /login answers 200 while they wait."""
    silent = SilentSocket()
    with ServedApp(tmp_path, KVNOTES_REQUEST_WAIT_S="3") as app, httpx.Client(base_url=app.url,
                                                                             timeout=60) as client:
        nid = _notebook(client)
        with ThreadPoolExecutor(8) as pool:
            replies = [pool.submit(client.post, f"/api/notebooks/{nid}/replays", json={"url": silent.url})
                       for _ in range(8)]
            while silent.accepted == 0:
                time.sleep(0.05)
            t0 = time.perf_counter()
            login = client.get("/login")
            took = time.perf_counter() - t0
            in_flight = silent.open
            statuses = sorted(r.result().status_code for r in replies)
        print(f"\n/login answered {login.status_code} in {took * 1000:.0f} ms with {in_flight} checks "
              f"in flight; replays: {statuses}; the silent socket took {silent.accepted} connections")
        assert login.status_code == 200
        assert in_flight >= 1  # /login was answered while the checks were still waiting
        assert statuses.count(422) >= 1 and set(statuses) <= {422, 429}, statuses
        assert silent.accepted <= 8
    silent.close()


def _run_replay(bounds: Bounds, url: str, stop: threading.Event | None = None) -> dict:
    """`replay` in a thread; returns what it raised and when."""
    out: dict = {}

    def go() -> None:
        t0 = time.monotonic()
        try:
            replay(_spec(), url, bounds=bounds, stop=stop)
        except ReplayError as exc:
            out["error"] = exc
        out["took_s"] = time.monotonic() - t0

    out["thread"] = threading.Thread(target=go, daemon=True)
    out["thread"].start()
    return out


def test_a_cancel_closes_the_stream_mid_answer(fake_vllm):
    """A server that streams keep-alives and never answers: the stop closes the stream at once."""
    server = fake_vllm("keepalive", every_s=0.5)
    stop = threading.Event()
    running = _run_replay(Bounds(request_s=600), server.url, stop)
    assert server.streaming.wait(30)
    stop.set()
    running["thread"].join(5)
    assert not running["thread"].is_alive(), "the replay still streams 5 s after its cancel"
    assert isinstance(running["error"], ReplayStopped) and "cancelled" in str(running["error"])
    assert server.gone.wait(5) and server.completions == 1  # the warm-up request, closed by the client


def test_a_replay_has_a_deadline_in_all_and_for_each_answer(fake_vllm):
    server = fake_vllm("keepalive", every_s=0.2)
    overall = _run_replay(Bounds(request_s=600, replay_s=2), server.url)
    overall["thread"].join(30)
    assert isinstance(overall["error"], ReplayStopped), overall
    assert "ran past its deadline of 2 s" in str(overall["error"])
    each = _run_replay(Bounds(request_s=2), server.url)
    each["thread"].join(30)
    assert not isinstance(each["error"], ReplayStopped)
    assert "did not answer as vLLM does (POST /v1/chat/completions)" in str(each["error"]), each
    print(f"\noverall deadline 2 s: stopped after {overall['took_s']:.1f} s; "
          f"per answer 2 s: failed after {each['took_s']:.1f} s")


def test_replays_count_against_the_per_user_cap(make_client, fake_vllm):
    server = fake_vllm()
    client = make_client(KVNOTES_MAX_ACTIVE_RUNS_PER_USER="2")
    nid = _notebook(client)
    codes = [client.post(f"/api/notebooks/{nid}/replays", json={"url": server.url}).status_code
             for _ in range(3)]
    assert codes == [201, 201, 429], codes
    r = client.post(f"/api/notebooks/{nid}/replays", json={"url": server.url})
    assert "KVNOTES_MAX_ACTIVE_RUNS_PER_USER" in r.text and r.headers["Retry-After"]
    assert len(client.get(f"/api/notebooks/{nid}/replays").json()) == 2


def test_a_deleted_replays_message_is_dropped_at_once_and_a_cancel_frees_the_worker(make_client, fake_vllm):
    """The task itself (run in this process, as a worker runs it): a message whose replay went with
    its notebook is dropped without waiting for the row; a running replay cancelled through the API
    stops mid-stream within seconds and keeps nothing."""
    from worker.replay_task import replay_task

    server = fake_vllm("keepalive", every_s=0.5)
    client = make_client()
    nid = _notebook(client)
    gone = client.post(f"/api/notebooks/{nid}/replays", json={"url": server.url}).json()
    token = _token(gone["id"])
    assert client.delete(f"/api/notebooks/{nid}").status_code == 204
    t0 = time.monotonic()
    assert replay_task.apply(args=(gone["id"],), task_id=token).get()["status"] == "skipped"
    dropped_s = time.monotonic() - t0
    assert dropped_s < 5, dropped_s  # it waited 10 s for the row (ROW_WAIT_S) before

    nid = _notebook(client)
    live = client.post(f"/api/notebooks/{nid}/replays", json={"url": server.url}).json()
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        replay_task.apply(args=(live["id"],), task_id=_token(live["id"])).get()), daemon=True)
    worker.start()
    assert server.streaming.wait(30)
    t0 = time.monotonic()
    assert client.post(f"/api/replays/{live['id']}/cancel").status_code == 200
    worker.join(5)
    print(f"\ndeleted replay's message dropped in {dropped_s * 1000:.0f} ms; cancelled replay freed its "
          f"worker in {time.monotonic() - t0:.1f} s")
    assert not worker.is_alive(), "the worker still streams 5 s after the cancel"
    assert result["status"] == "cancelled" and server.gone.wait(5)  # the stream was closed
    assert client.get(f"/api/replays/{live['id']}").json()["result"] is None


def _token(replay_id: int) -> str:
    from data.db import get_sessionmaker
    from data.replays import Replay

    with get_sessionmaker()() as s:
        return s.get(Replay, replay_id).task_id


def test_base_url_keeps_what_operators_paste():
    assert base_url("http://127.0.0.1:8100/v1/") == "http://127.0.0.1:8100"
    assert base_url(" https://vllm.internal.example:443/v1 ") == "https://vllm.internal.example:443"
