"""No 5xx of the gateway's own (issue 39 item 4), property-based: `hypothesis` draws OpenAI chat and
completion requests (the documented fields, each sometimes any JSON value instead; long system
prompts that share a template with drawn values, so the diff and the layouts run; streamed and
not; sometimes bytes that are not a JSON object at all) and sends them through both the standalone
gateway (`kvnotes gateway`, erratum) and `/gateway/v1` under the web app (`hoist`). Every answer
is under 500, and every 4xx is in OpenAI's error shape.

The upstream is a real HTTP peer that records what it is sent and always answers 200 (a stream
when `stream` is true), so any 5xx would be the gateway's own. Examples are few (the CPU is
shared); `derandomize` draws the same ones every run.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import LocalServer, ServedApp
from tests.serving.engines import Gateway

EXAMPLES = 80
RULES = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Recorder(LocalServer):
    """An OpenAI-compatible peer that answers every completion 200, whatever it is sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                recorder.send(self, {"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with recorder.lock:
                    recorder.bodies.append(data)
                try:
                    body = json.loads(data)
                except ValueError:
                    body = None
                stream = isinstance(body, dict) and body.get("stream") is True
                recorder.answer(self, stream)

        self.start(Handler)

    def send(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def answer(self, handler: BaseHTTPRequestHandler, stream: bool) -> None:
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}}
        if not stream:
            choice = {"index": 0, "message": {"role": "assistant", "content": "It is Oslo."},
                      "finish_reason": "stop"}
            return self.send(handler, {"id": "x", "object": "chat.completion", "choices": [choice],
                                       "usage": usage})
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        for event in ({"choices": [{"index": 0, "delta": {"content": "It is"}}]},
                      {"choices": [{"index": 0, "delta": {"content": " Oslo."}, "finish_reason": "stop"}]},
                      {"choices": [], "usage": usage}):
            handler.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.close_connection = True


# --- what a client may send ------------------------------------------------------------------------

LEAF = (st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20)
        | st.floats(allow_nan=False, allow_infinity=False))
ANY = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3)
                   | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
VALUE = st.text(max_size=12) | st.sampled_from(["Oslo", "Rome", "08:07", "09:12", "", "a\nb", "Oslo Rome"])
TEMPLATE = ("record_id: SR-20417\ndestination: {}\ndeparture: {}\n\n"
            + "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking."
                        for i in range(24)))
LONG = st.builds(lambda a, b: TEMPLATE.format(a, b), VALUE, VALUE)  # ~1,500 characters: a base, then diffs
TEXT = LONG | st.text(max_size=60)
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | ANY}, optional={"text": TEXT})
CONTENT = TEXT | st.lists(PART, max_size=2) | st.none() | ANY
ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | ANY
MESSAGE = st.fixed_dictionaries({"role": ROLE, "content": CONTENT},
                                optional={"name": st.text(max_size=8), "tool_calls": ANY}) | ANY
COMMON = {"stream": st.booleans() | ANY, "stream_options": st.just({"include_usage": True}) | ANY,
          "temperature": st.sampled_from([0, 0.0, 0.7]) | ANY, "max_tokens": st.integers(1, 8) | ANY,
          "n": st.integers(1, 2) | ANY, "stop": st.text(max_size=4) | ANY, "seed": ANY, "user": ANY}
MODEL = st.one_of(st.just("m"), st.just("m"), ANY)
ASKED = st.builds(lambda system, ask: [{"role": "system", "content": system},  # the shape the gateway
                                       {"role": "user", "content": ask}],  # rewrites: drawn most often
                  LONG, st.text(max_size=20))
MESSAGES = st.one_of(ASKED, ASKED, ASKED, st.lists(MESSAGE, min_size=0, max_size=4), ANY)
CHAT = st.fixed_dictionaries({"model": MODEL, "messages": MESSAGES},
                             optional={**COMMON, "tools": ANY, "response_format": ANY, "logprobs": ANY})
PROMPT = st.builds(lambda context, question: context + "\n\n" + question, LONG, st.text(max_size=20))
COMPLETION = st.fixed_dictionaries(
    {"model": MODEL, "prompt": st.one_of(PROMPT, PROMPT, PROMPT, TEXT, st.lists(st.text(max_size=8),
                                                                                 max_size=2),
                                         st.lists(st.integers(0, 50), max_size=3), ANY)},
    optional={**COMMON, "echo": ANY, "suffix": ANY, "best_of": ANY})
RAW = (st.binary(max_size=40) | st.sampled_from([b"[" * 1001 + b"]" * 1001, b'{"messages": [NaN]}',
                                                  b'{"prompt": "\\ud800"}', b"\xff\xfe{}", b'"a"', b"{}"]))
REQUEST = (st.tuples(st.just("/chat/completions"), CHAT) | st.tuples(st.just("/completions"), COMPLETION)
           | st.tuples(st.sampled_from(["/chat/completions", "/completions"]), RAW))


def _send(client: httpx.Client, base: str, route: str, body: dict | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(base + route, content=body, headers={"content-type": "application/json"})
    return client.post(base + route, json=body)


def _no_5xx(answer: httpx.Response) -> str:
    """Check the answer; its `x-kvnotes-gateway` header ("" on a 400 before any plan)."""
    assert answer.status_code < 500, (answer.status_code, answer.text[:500])
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert isinstance(error["message"], str) and error["type"] and error["code"] == answer.status_code
    return answer.headers.get("x-kvnotes-gateway", "")


@pytest.fixture(scope="module")
def recorder():
    peer = Recorder()
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, recorder):
    gateway = Gateway(tmp_path_factory.mktemp("fuzz-gateway"), f"{recorder.url}/v1", "--check-rate", "0.5")
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def served_app(tmp_path_factory, recorder):
    with ServedApp(tmp_path_factory.mktemp("fuzz-serve"), "tiny-llama", KVNOTES_GATEWAY_POLICY="hoist",
                   KVNOTES_GATEWAY_UPSTREAM=f"{recorder.url}/v1", KVNOTES_GATEWAY_CHECK_RATE="0.5") as app:
        yield app


def _fuzz(base: str, **client: object) -> list[str]:
    """Send every drawn request to `base`; the headers of the answers."""
    headers: list[str] = []
    with httpx.Client(timeout=30, **client) as http:

        @RULES
        @given(REQUEST)
        def property(request: tuple[str, dict | bytes]) -> None:
            headers.append(_no_5xx(_send(http, base, *request)))

        property()
    return headers


def test_the_standalone_gateway_answers_no_5xx(standalone, recorder):
    headers = _fuzz(f"{standalone.url}/v1", headers={"Authorization": "Bearer sk-fuzz"})
    assert headers.count("erratum") >= 3  # the diff and the layout ran (9 of 80 on this draw)
    assert recorder.bodies  # requests did reach the upstream
    assert "Traceback" not in standalone.log.read_text()  # nor a plan that failed and passed through


def test_the_gateway_under_the_web_app_answers_no_5xx(served_app):
    headers = _fuzz(f"{served_app.url}/gateway/v1")
    assert headers.count("hoist") >= 3  # the diff and the hoist layout ran (18 of 80 on this draw)
