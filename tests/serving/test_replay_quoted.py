"""`kvnotes replay` says what a server answered when it did not answer as vLLM does (issue 44): its
HTTP status and the first 200 characters of its body, or the exception. The servers are real HTTP
servers on loopback (`tests.serving.engines.Engine`, speaking vLLM's API, made to answer wrong at one
step); the web's replays still quote nothing (`test_replay_bounds`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.serving.engines import Engine

# vLLM's own answer to a prompt past --max-model-len (the shape its OpenAI server writes)
TOO_LONG = {"error": {"message": "This model's maximum context length is 4096 tokens. However, you "
                                 "requested 4113 tokens (4097 in the messages, 16 in the completion).",
                      "type": "BadRequestError", "param": None, "code": 400}}
ENGINE_DEAD = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the "
                                    "root cause.", "type": "InternalServerError", "code": 500}}


class Wrong(Engine):
    """vLLM's API, answering wrong at one step (`how`):
    "models 500": `/v1/models` answers HTTP 500 (a server still starting, or broken);
    "models not JSON": `/v1/models` answers 200 with a body cut short;
    "chat 400" / "chat 500": every completion answers that status with vLLM's error body;
    "chat long": every completion answers 400 with a 1,000-character body;
    "event not JSON": every completion streams an event whose data is cut short."""

    def __init__(self, how: str) -> None:
        self.how = how
        super().__init__()

    def get(self, h: BaseHTTPRequestHandler) -> None:
        if h.path == "/v1/models" and self.how == "models 500":
            return self.send(h, 500, b"Internal Server Error: the engine is not ready", "text/plain")
        if h.path == "/v1/models" and self.how == "models not JSON":
            return self.send(h, 200, b'{"object": "list", "data": [{"id": "smollm2-', "application/json")
        super().get(h)

    def complete(self, h: BaseHTTPRequestHandler, body: dict, chat: bool) -> None:
        if self.how in ("chat 400", "chat 500"):
            status = int(self.how[-3:])
            return self.send(h, status, TOO_LONG if status == 400 else ENGINE_DEAD)
        if self.how == "chat long":
            return self.send(h, 400, ("0123456789" * 100).encode(), "text/plain")
        if self.how == "event not JSON":
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.write(b'data: {"id": "cmpl-1", "choices": [{"delta": {"content": "Tro\n\n')
            h.wfile.flush()
            h.close_connection = True
            return
        super().complete(h, body, chat)


@pytest.fixture
def document(tmp_path: Path) -> str:
    path = tmp_path / "record.txt"
    path.write_text("CONSIGNMENT RECORD\nconsignee: Halden Tools\ndestination: Tromso\nweight: 412 kg\n")
    return str(path)


@pytest.fixture
def wrong() -> Iterator:
    made: list[Wrong] = []

    def make(how: str) -> Wrong:
        made.append(Wrong(how))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _replay(url: str, document: str, capsys) -> tuple[int, str]:
    from commands.cli import main

    status = main(["replay", "--url", f"{url}/v1", "--document", document, "--field", "Tromso",
                   "--values", "Valencia,Porto", "--question", "What is the destination of this consignment?",
                   "--variants", "in_place,erratum", "--rate", "50", "--json"])
    captured = capsys.readouterr()
    return status, captured.err.strip()


@pytest.mark.parametrize("how, asked, quoted", [
    ("models 500", "GET /v1/models", "HTTP 500: 'Internal Server Error: the engine is not ready'"),
    ("models not JSON", "GET /v1/models", """not JSON: '{"object": "list", "data": [{"id": "smollm2-'"""),
    ("chat 400", "POST /v1/chat/completions", "HTTP 400: " + repr(json.dumps(TOO_LONG)[:200])),
    ("chat 500", "POST /v1/chat/completions", "HTTP 500: " + repr(json.dumps(ENGINE_DEAD)[:200])),
    ("event not JSON", "POST /v1/chat/completions",
     """an event that is not a JSON object: '{"id": "cmpl-1", "choices": [{"delta": {"content": "Tro'"""),
])
def test_a_server_answering_wrong_is_quoted(how, asked, quoted, wrong, document, isolated, capsys):
    isolated()
    server = wrong(how)
    status, err = _replay(server.url, document, capsys)
    where = "in_place warm-up request failed: " if asked.startswith("POST") else ""
    said = f"kvnotes: {where}the server at {server.url} did not answer as vLLM does ({asked}): {quoted}"
    assert status == 2 and err == said, err
    assert len(err.splitlines()) == 1


def test_only_the_first_200_characters_of_a_body_are_quoted(wrong, document, isolated, capsys):
    isolated()
    status, err = _replay(wrong("chat long").url, document, capsys)
    body = "0123456789" * 100
    assert status == 2 and err.endswith(f"(POST /v1/chat/completions): HTTP 400: '{body[:200]}'"), err


def test_a_server_not_listening_is_quoted_as_the_exception(document, isolated, capsys):
    isolated()
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    status, err = _replay(url, document, capsys)
    assert status == 2 and err.startswith(f"kvnotes: the server at {url} did not answer as vLLM does "
                                          "(GET /v1/models): ConnectError: "), err
    assert "refused" in err.lower(), err
