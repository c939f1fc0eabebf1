"""One vLLM server for the serving tests, started once per test session from `scripts/vllm.sh`
(the bundled smollm2-135m, on a free port), a short document to replay on it, and a trajectory
(`trajectory`: turns appending log lines to a longer record, its destination changed twice).

Under `CI=true` a server that cannot start fails the suite; elsewhere the tests skip with the
reason (a missing vLLM virtualenv is not installed from here: that is 3.5 GB). `KVNOTES_TEST_VLLM_URL`
points the tests at a server already running (started by `scripts/vllm.sh`, so its prefix cache can
be emptied between variants) instead.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from serving import TrajectoryReplaySpec
from tests.conftest import REPO, UNDER_CI, LocalServer, ServedApp, free_port, missing, shared
from vocabulary.trajectories import FieldSpec, TurnSpec

START_TIMEOUT_S = 600  # about 3 minutes on 2 busy cores; more when the machine is loaded
VENV = Path(os.environ.get("KVNOTES_VLLM_VENV") or REPO / ".venv-vllm")

# ~700 tokens: a shipment record whose destination (the field) is near the top, then a log.
LOG_LINES = [f"2026-03-01 {8 + i // 6:02d}:{(i * 7) % 60:02d} {event}" for i, event in enumerate([
    "Customer care archived the invoice draft without remarks.",
    "Operations logged the insurance check for the container.",
    "The warehouse confirmed the pallet count against the manifest.",
    "Billing sent the freight quote to the customer contact.",
    "The carrier updated the pickup window for the terminal.",
    "Customs pre-cleared the commercial invoice and packing list.",
    "Operations noted the seal number on the container record.",
    "The driver confirmed arrival at the loading dock.",
    "Quality control signed off the temperature log.",
    "The customer asked for a copy of the bill of lading.",
    "Dispatch assigned the truck and trailer numbers.",
    "The terminal confirmed the vessel cut-off time.",
] * 2)]
DOCUMENT = ("SHIPMENT RECORD\nrecord_id: SR-20417\ncustomer: Halvorsen Marine AS\ndestination: Oslo\n"
            "carrier: NordFreight\n\nOperations log:\n" + "\n".join(LOG_LINES) + "\n")
QUESTION = "What is the destination of this shipment?"
CHOICES = ("Oslo", "Madrid", "Rome", "Lisbon")

# ~1,300 tokens: the shipment record, its destination near the top, and its log twice over, so a
# turn's few dozen new tokens and the 128-token block rounding of vLLM's CPU cache stay small beside it
RECORD = DOCUMENT + "\n".join(LOG_LINES) + "\n"
START = RECORD.index("Oslo")
EVENTS = ["The carrier confirmed the booking.", "Customs asked for the certificate of origin.",
          "The warehouse loaded the container.", "The vessel left the terminal on time.",
          "The customer asked for the arrival estimate.", "Billing issued the final invoice.",
          "The agent at the port confirmed the berth."]
# 7 turns, each appending a log line; the destination changes at turns 3 and 5
CHANGES = {2: "Madrid", 4: "Rome"}

# ~2,700 tokens (issues 44 and 52): the consignment record, a header whose destination (the field) is
# near the top, then 170 short ledger lines ("001 02-01 pallet wrap x2 ok", ~15 tokens each)
_ITEMS = ("pallet wrap", "steel brackets", "hand drills", "torque keys", "saw blades", "bolt sets", "clamps")
CONSIGNMENT = ("CONSIGNMENT RECORD\nconsignee: Halden Tools\ndestination: Tromso\nweight: 412 kg\n\n"
               + "".join(f"{i + 1:03d} 02-{1 + i % 28:02d} {_ITEMS[i % len(_ITEMS)]} x{2 + i % 9} ok\n"
                         for i in range(170)))
CONSIGNMENT_QUESTION = "What is the destination of this consignment?"


REPLAY_DOC = "SHIPMENT\ndestination: Oslo\ncarrier: NordFreight\n"


def replay_notebook(client) -> int:
    """A notebook (through the API of `client`) with a field (Oslo -> Rome) and a question: what a
    replay on the web needs."""
    r = client.post("/api/notebooks", json={"title": "s", "model": "smollm2-135m", "text": REPLAY_DOC})
    assert r.status_code == 201, r.text
    nid = r.json()["id"]
    start = REPLAY_DOC.index("Oslo")
    assert client.post(f"/api/notebooks/{nid}/fields",
                       json={"start": start, "end": start + 4, "new_value": "Rome"}).status_code == 201
    assert client.put(f"/api/notebooks/{nid}/question", json={"text": "Where?"}).status_code == 200
    return nid


def run_replay_task(replay_id: int, result: dict) -> None:
    """The replay's message run in this process, as a worker takes it (under the row's token); what
    the task returned goes into `result`."""
    from data.db import get_sessionmaker
    from data.replays import Replay
    from worker.replay_task import replay_task

    with get_sessionmaker()() as s:
        token = s.get(Replay, replay_id).task_id
    result.update(replay_task.apply(args=(replay_id,), task_id=token).get())


def trajectory(n: int = 7, **kw) -> TrajectoryReplaySpec:
    """The first `n` turns over RECORD, as a trajectory replay (`kw`: more of its fields)."""
    turns = tuple(TurnSpec(append=f"2026-03-02 09:{10 + i:02d} {EVENTS[i % len(EVENTS)]}\n",
                           fields={"destination": CHANGES[i]} if i in CHANGES else {}) for i in range(n))
    return TrajectoryReplaySpec(RECORD, (FieldSpec("destination", START, START + 4),), turns, QUESTION,
                                CHOICES, **kw)


def _served(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/models", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _start(log: Path, model: str = "smollm2-135m") -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "KVNOTES_VLLM_VENV": str(VENV), "KVNOTES_DATA": str(REPO / "var" / "test-data")}
    out = log.open("w")
    proc = subprocess.Popen([str(REPO / "scripts" / "vllm.sh"), "--model", model, "--port", str(port)],
                            cwd=REPO, env=env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None and not _served(url):
        time.sleep(2)
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


@pytest.fixture
def vllm_url(tmp_path_factory) -> str:
    """The base URL of the run's one vLLM server serving `smollm2-135m` (`shared`: started by the
    first test that needs it, stopped after the last)."""
    existing = os.environ.get("KVNOTES_TEST_VLLM_URL")
    if existing:
        if not _served(existing.rstrip("/").removesuffix("/v1")):
            missing(f"KVNOTES_TEST_VLLM_URL={existing} does not answer")
        return existing.rstrip("/").removesuffix("/v1")
    return shared("vllm_url", lambda: _serving(tmp_path_factory.mktemp("vllm"), "smollm2-135m"))


@contextmanager
def _serving(where: Path, model: str) -> Iterator[str]:
    """Start `scripts/vllm.sh --model model`, yield its base URL, stop it."""
    if not UNDER_CI and not (VENV / "bin" / "python").exists():
        missing(f"no vLLM virtualenv at {VENV}: run scripts/vllm.sh once (or set KVNOTES_VLLM_VENV)")
    log = where / "vllm.log"
    proc, url = _start(log, model)
    if not _served(url):
        if proc.poll() is None:
            _stop(proc)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        missing(f"scripts/vllm.sh did not serve within {START_TIMEOUT_S} s (exit {proc.poll()}):\n{tail}")
    try:
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def base_model_url(tmp_path_factory) -> Iterator[str]:
    """A vLLM server serving smollm2-135m as a base model: the converted folder without its chat
    template (the weights linked, not copied), as a model published without one is served."""
    source = REPO / "var" / "test-data" / "models" / "smollm2-135m"
    if not (source / "config.json").exists():  # converted by the session's server on first use
        subprocess.run([sys.executable, "-c", "import sys, pathlib, worker.engine.models as m\n"
                        "m.ensure_converted('smollm2-135m', pathlib.Path(sys.argv[1]))",
                        str(REPO / "var" / "test-data")], cwd=REPO, check=True)
    where = tmp_path_factory.mktemp("vllm-base")
    folder = where / "smollm2-135m-base"
    folder.mkdir()
    for item in source.iterdir():
        if item.name == "chat_template.jinja":
            continue
        if item.suffix == ".safetensors":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with _serving(where, str(folder)) as url:
        yield url


class DyingServer:
    """A TCP relay in front of the real server that can die: `kill()` closes its listening socket and
    every open connection at once, as a server process that crashes does."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        self.dead = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.dead:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def kill(self) -> None:
        self.dead = True
        for s in [self.listener, *self.sockets]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture
def served(tmp_path_factory, vllm_url) -> ServedApp:
    """The web app, a real Celery worker (tiny-llama) and the replays' own worker (a replay loads
    no model), whose default vLLM server is the run's: one for the run (`shared`), each test
    making its own notebook."""
    return shared("served", lambda: ServedApp(tmp_path_factory.mktemp("served"), "tiny-llama", worker=True,
                                              replays=True, KVNOTES_VLLM_URL=f"{vllm_url}/v1"))


def make_notebook(client: httpx.Client) -> int:
    """A notebook holding DOCUMENT, its destination as the field (Oslo → Madrid) and the question."""
    start = DOCUMENT.index("Oslo")
    notebook = client.post("/api/notebooks",
                           json={"title": "shipment", "model": "tiny-llama", "text": DOCUMENT})
    assert notebook.status_code == 201, notebook.text
    nid = notebook.json()["id"]
    field = client.post(f"/api/notebooks/{nid}/fields",
                        json={"start": start, "end": start + 4, "new_value": "Madrid",
                              "label": "destination"})
    assert field.status_code == 201, field.text
    question = client.put(f"/api/notebooks/{nid}/question", json={"text": QUESTION, "choices": list(CHOICES)})
    assert question.status_code == 200, question.text
    return nid


class FakeVllm(LocalServer):
    """A local HTTP server on 127.0.0.1 that answers the replay's preflight as vLLM does
    (`/v1/models`, `/tokenize`), and whose completions stream (`mode`):
    "keepalive": a comment every `every_s` and never an answer, until the client goes;
    "secret": every request answered 403 with a body that must never be quoted back.
    `completions` counts completion requests; `gone` is set when a streaming client disconnected."""

    def __init__(self, mode: str = "keepalive", every_s: float = 0.5) -> None:
        from http.server import BaseHTTPRequestHandler

        fake = self
        self.mode, self.every_s = mode, every_s
        self.completions = 0
        self.streaming, self.gone = threading.Event(), threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if fake.mode == "secret":
                    return self._send(403, {"secret": "INTERNAL-ONLY-TOKEN-abc123"})
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": "fake-model", "max_model_len": 4096}]})
                self._send(404, {"detail": "not here"})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if fake.mode == "secret":
                    return self._send(403, {"secret": "INTERNAL-ONLY-TOKEN-abc123"})
                if self.path == "/tokenize":
                    return self._send(200, {"tokens": list(range(50)), "count": 50})
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"detail": "not here"})
                fake.completions += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                fake.streaming.set()
                try:
                    while True:
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                        time.sleep(fake.every_s)
                except OSError:
                    fake.gone.set()

        self.start(Handler)


@pytest.fixture
def fake_vllm() -> Iterator[Callable[..., FakeVllm]]:
    """`fake_vllm(mode="keepalive", every_s=0.5)`: a `FakeVllm`, closed after the test."""
    made: list[FakeVllm] = []

    def make(mode: str = "keepalive", every_s: float = 0.5) -> FakeVllm:
        made.append(FakeVllm(mode, every_s))
        return made[-1]

    yield make
    for server in made:
        server.close()


class SilentSocket:
    """A socket on 127.0.0.1 that accepts every connection and never answers; `open` counts the
    connections it holds now, `accepted` all it took."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)

    @property
    def open(self) -> int:
        """Connections whose client has not closed them yet."""
        count = 0
        for conn in self.held:
            conn.setblocking(False)
            try:
                while conn.recv(65536):  # what the client sent, then b"" once it closed
                    pass
            except BlockingIOError:
                count += 1
            except OSError:
                pass
        return count

    def close(self) -> None:
        for conn in [self.listener, *self.held]:
            conn.close()


GATEWAY_REDIS = "redis://127.0.0.1:6379/0"  # the machine's Redis, where the gateway tests keep their state


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis key prefix of this test's own (`--state redis://…#PREFIX`), its keys removed after it;
    no Redis at `GATEWAY_REDIS` is `missing` (a failure under CI)."""
    import uuid

    import redis

    name = f"kvnotes-test:{uuid.uuid4().hex[:10]}:"
    client = redis.Redis.from_url(GATEWAY_REDIS)
    try:
        client.ping()
    except redis.RedisError as exc:
        missing(f"no Redis at {GATEWAY_REDIS}: {exc}")
    yield name
    keys = list(client.scan_iter(f"{name}*"))
    if keys:
        client.delete(*keys)
    client.close()
