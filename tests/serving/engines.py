"""A small real HTTP server that speaks a serving engine's documented API, deterministically: the
OpenAI endpoints (`/v1/models`, `/v1/chat/completions`, `/v1/completions`, streamed and not) and,
by `dialect`, vLLM's (`/tokenize`, `/reset_prefix_cache`, `vllm:prefix_cache_*` in `/metrics`) or
SGLang's (`/v1/tokenize`, `/flush_cache`, `sglang:prompt_tokens_total` and
`sglang:cached_tokens_total`). Not a mock of kvnotes: a peer on a socket, as the engine is.

Its prefix cache is exact and token-level, as RadixAttention and vLLM's block cache are (here one
token is one character, no blocks): a prompt's cached tokens are its longest common prefix with any
prompt seen since the last reset with the same `cache_salt` (as vLLM hashes the salt into a
prompt's first block), reported as `usage.prompt_tokens_details.cached_tokens` and summed into the
counters.

Its answer reads the prompt's `key` (default "destination"): `reads="first"` answers the value on
the key's line as first written (a model that ignores errata), `reads="last"` the last value stated
(the line, or an erratum "key has changed from A to B"). `fault` makes it fail: "500" answers every
completion with HTTP 500, "slow" waits `delay_s` before answering, "trickle" streams one event every
`delay_s` forever (`gone` is set when the client went away), "paced" streams `paced_events`
events (8; the answer's words, then empty ones) `delay_s` apart, "stall" falls silent `delay_s` after
its first event,
"linger" holds the stream open `delay_s` after its `data: [DONE]`, "silent" accepts the request and
sends nothing at all for `delay_s` (`gone` once the client closed), "queued" holds the request
`delay_s` before its first byte while its `/metrics` show other work going on (a busy server's
queue: `vllm:prompt_tokens_total` and `vllm:iteration_tokens_total_count` grow every 0.1 s).
`faulty_from`: the first completion (0-based) the fault applies to; those before are answered well.
`answer_after_s` holds every answer that is not streamed that long first.
`/metrics` (vLLM's dialect) also carries the progress a replay reads: requests running and waiting,
prompt and generated tokens, engine steps, which stand still unless a completion is being answered.

With `events=True` it publishes its cache's changes as vLLM's KV events do (`--kv-events-config`: a
ZMQ PUB socket at `events_url`, multipart topic / 8-byte sequence / msgpack `[ts, events, None]`):
`BlockStored` for each full block of `EVENT_BLOCK` tokens it stores, with hashes of its own (seeded
per process, as vLLM's are), and `restart()` forgets everything and says `AllBlocksCleared`, its
sequence starting again at 0, as a restarted vLLM does.

`Gateway` runs `kvnotes gateway` as a real process in front of either (or of a real vLLM server).
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, LocalServer, free_port, kvnotes_env, listening, stop_process

EVENT_BLOCK = 16  # the tokens (characters) of one block in the KV events


class Engine(LocalServer):
    def __init__(self, dialect: str = "vllm", model: str = "smollm2-135m", key: str = "destination",
                 reads: str = "last", fault: str = "", delay_s: float = 0.0, max_model_len: int = 8192,
                 chat: bool = True, events: bool = False, faulty_from: int = 0,
                 paced_events: int = 8, answer_after_s: float = 0.0) -> None:
        self.paced_events, self.answer_after_s = paced_events, answer_after_s
        self.dialect, self.model, self.key, self.reads = dialect, model, key, reads
        self.fault, self.delay_s, self.max_model_len, self.chat = fault, delay_s, max_model_len, chat
        self.faulty_from = faulty_from
        self.running = self.waiting = self.prompt_tokens = self.generated = self.steps = 0
        self.seen: list[tuple[str | None, str]] = []  # (cache_salt, prompt)
        self.queries = self.hits = 0
        self.completions: list[dict] = []  # every completion request's body, in order
        self.gone = threading.Event()
        self.lock = threading.Lock()
        self.dead = False  # `kill`: a stopped process (its open connections drop every request)
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if engine.dead:
                    self.close_connection = True
                    return
                engine.get(self)

            def do_POST(self) -> None:
                if engine.dead:
                    self.close_connection = True
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                engine.post(self, json.loads(body or b"{}"))

        self.start(Handler)
        self.events_url = ""
        self._pub = None
        self._seq = 0
        self._blocks: set[int] = set()  # the hashes of the blocks stored (events)
        if events:
            import zmq

            self._zmq = zmq.Context()
            self._pub = self._zmq.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            port = self._pub.bind_to_random_port("tcp://127.0.0.1")
            self.events_url = f"tcp://127.0.0.1:{port}"

    def publish(self, events: list[dict]) -> None:
        """One batch of events (under `lock`), with the next sequence number."""
        import msgpack

        if self._pub is None:
            return
        payload = msgpack.packb([time.time(), events, None])
        self._pub.send_multipart([b"", self._seq.to_bytes(8, "big"), payload])
        self._seq += 1

    def _stored(self, prompt: str, salt: str | None) -> None:
        """Publish the blocks of `prompt` not stored yet; the `cache_salt` is hashed into every block
        (through the first) and named in the first block's extra keys, as vLLM does."""
        if self._pub is None:
            return
        tokens = [ord(c) for c in prompt]
        parent, hashes, ids, extra, first_parent = None, [], [], [], None
        for end in range(EVENT_BLOCK, len(tokens) + 1, EVENT_BLOCK):  # chained: linear in the prompt
            h = hash(("seed", salt, parent, tuple(tokens[end - EVENT_BLOCK:end]))) & (2**63 - 1)
            if h not in self._blocks:
                if not hashes:
                    first_parent = parent
                self._blocks.add(h)
                hashes.append(h)
                ids += tokens[end - EVENT_BLOCK:end]
                extra.append([salt] if salt and end == EVENT_BLOCK else None)
            parent = h
        if hashes:
            self.publish([{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": first_parent,
                           "token_ids": ids, "block_size": EVENT_BLOCK, "lora_id": None, "medium": "CPU",
                           "lora_name": None, "extra_keys": extra if any(extra) else None}])

    def restart(self) -> None:
        """Forget the cache as a restarted engine does; its events say so from sequence 0."""
        with self.lock:
            self.seen.clear()
            self._blocks.clear()
            self._seq = 0
            self.publish([{"type": "AllBlocksCleared"}])

    def kill(self) -> None:
        """Stop as a process does: no new connection, and none kept alive answers again."""
        self.dead = True
        self.close()

    def close(self) -> None:
        super().close()
        if self._pub is not None:
            self._pub.close(0)
            self._zmq.term()
            self._pub = None

    # --- what the engine computes ------------------------------------------------------------------

    def render(self, body: dict) -> str:
        """The prompt text: chat messages through a fixed template, or the completion's prompt."""
        if "messages" in body:
            if not self.chat:
                raise ValueError("this model has no chat template")
            return "".join(f"<|{m['role']}|>{m['content']}\n" for m in body["messages"]) + "<|assistant|>"
        return str(body.get("prompt", ""))

    def cache(self, prompt: str, salt: str | None = None) -> int:
        """Look `prompt` up in the prefix cache among the prompts of the same `salt` (then keep it);
        the tokens found."""
        with self.lock:
            best = 0
            for earlier in [p for s, p in self.seen if s == salt]:
                n = 0
                for a, b in zip(earlier, prompt):
                    if a != b:
                        break
                    n += 1
                best = max(best, n)
            cached = min(best, len(prompt) - 1)
            self.seen.append((salt, prompt))
            self._stored(prompt, salt)
            self.queries += len(prompt)
            self.hits += cached
            return cached

    def answer(self, prompt: str) -> str:
        values = re.findall(rf"{re.escape(self.key)}(?: has changed from [^;\n]* to|:) ([A-Za-z]+)", prompt)
        if not values:
            return "I do not know."
        return f"The {self.key} is {values[0] if self.reads == 'first' else values[-1]}."

    # --- HTTP --------------------------------------------------------------------------------------

    def send(self, handler: BaseHTTPRequestHandler, status: int, body: object,
             kind: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def get(self, h: BaseHTTPRequestHandler) -> None:
        if h.path == "/v1/models":
            card = {"id": self.model, "object": "model", "owned_by": self.dialect,
                    "max_model_len": self.max_model_len}
            return self.send(h, 200, {"object": "list", "data": [card]})
        if h.path == "/metrics":
            if self.dialect == "vllm":
                labels = f'{{engine="0",model_name="{self.model}"}}'
                text = (f"vllm:prefix_cache_queries_total{labels} {self.queries}.0\n"
                        f"vllm:prefix_cache_hits_total{labels} {self.hits}.0\n"
                        f"vllm:num_requests_running{labels} {self.running}.0\n"
                        f"vllm:num_requests_waiting{labels} {self.waiting}.0\n"
                        f"vllm:prompt_tokens_total{labels} {self.prompt_tokens}.0\n"
                        f"vllm:generation_tokens_total{labels} {self.generated}.0\n"
                        f"vllm:iteration_tokens_total_count{labels} {self.steps}.0\n")
            else:
                text = (f'sglang:prompt_tokens_total{{model_name="{self.model}"}} {self.queries}.0\n'
                        f'sglang:cached_tokens_total{{model_name="{self.model}",cache_source="device"}} '
                        f'{self.hits}.0\n')
            return self.send(h, 200, text.encode(), "text/plain")
        self.send(h, 404, {"detail": "Not Found"})

    def post(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        tokenize = "/tokenize" if self.dialect == "vllm" else "/v1/tokenize"
        reset = "/reset_prefix_cache" if self.dialect == "vllm" else "/flush_cache"
        if h.path == tokenize:
            try:
                text = self.render(body)
            except ValueError as exc:
                return self.send(h, 400, {"error": {"message": f"{exc}: no chat template", "code": 400}})
            return self.send(h, 200, {"tokens": [ord(c) for c in text], "count": len(text),
                                      "max_model_len": self.max_model_len})
        if h.path == reset:
            with self.lock:
                self.seen.clear()
                if self._blocks:
                    self._blocks.clear()
                    self.publish([{"type": "AllBlocksCleared"}])
            return self.send(h, 200, b"", "text/plain")
        if h.path in ("/v1/chat/completions", "/v1/completions"):
            return self.complete(h, body, chat=h.path.endswith("chat/completions"))
        self.send(h, 404, {"detail": "Not Found"})

    def complete(self, h: BaseHTTPRequestHandler, body: dict, chat: bool) -> None:
        self.completions.append(body)
        fault = self.fault if len(self.completions) > self.faulty_from else ""
        if fault == "silent":
            return self.hold_silent(h)
        if fault == "queued":
            self.queue_behind_others()
        if fault == "500":
            return self.send(h, 500, {"error": {"message": "engine fault", "type": "InternalServerError"}})
        if fault == "slow":
            time.sleep(self.delay_s)
        if body.get("model") not in (None, self.model):
            return self.send(h, 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "code": 404}})
        prompt = self.render(body)
        cached = self.cache(prompt, body.get("cache_salt"))
        text = self.answer(prompt)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(text.split()),
                 "total_tokens": len(prompt) + len(text.split()),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            time.sleep(self.answer_after_s)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                      if chat else {"index": 0, "text": text, "finish_reason": "stop"})
            return self.send(h, 200, {"id": "cmpl-1", "object": kind, "created": 1, "model": self.model,
                                      "choices": [choice], "usage": usage})
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        words = [w + " " for w in text.split(" ")]
        words[-1] = words[-1].rstrip()
        pad = {"trickle": 10**6, "paced": max(0, self.paced_events - len(words))}.get(fault, 0)
        try:
            for i, word in enumerate(words + [""] * pad):
                last = i == len(words) - 1
                delta = {"content": word} if chat else None
                choice = ({"index": 0, "delta": delta, "finish_reason": "stop" if last else None} if chat
                          else {"index": 0, "text": word, "finish_reason": "stop" if last else None})
                event = {"id": "cmpl-1", "object": f"{kind}.chunk", "created": 1, "model": self.model,
                         "choices": [choice]}
                h.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                h.wfile.flush()
                if fault in ("trickle", "paced") or (fault == "stall" and i == 0):
                    time.sleep(self.delay_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                event = {"id": "cmpl-1", "object": f"{kind}.chunk", "created": 1, "model": self.model,
                         "choices": [], "usage": usage}
                h.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            h.wfile.write(b"data: [DONE]\n\n")
            h.wfile.flush()
            if fault == "linger":
                time.sleep(self.delay_s)
            with self.lock:
                self.prompt_tokens += len(prompt)
                self.generated += len(words)
                self.steps += len(words)
        except OSError:
            self.gone.set()
        h.close_connection = True

    def hold_silent(self, h: BaseHTTPRequestHandler) -> None:
        """Send nothing for `delay_s` (counted as waiting), watching for the client to close."""
        with self.lock:
            self.waiting += 1
        try:
            deadline = time.monotonic() + self.delay_s
            while time.monotonic() < deadline:
                readable, _, _ = select.select([h.connection], [], [], 0.1)
                if readable and not h.connection.recv(1, socket.MSG_PEEK):
                    break
        except OSError:  # reset by the client
            pass
        finally:
            self.gone.set()
            with self.lock:
                self.waiting -= 1
            h.close_connection = True

    def queue_behind_others(self) -> None:
        """Wait `delay_s` in the queue while another request's prefill goes on (its counters move)."""
        with self.lock:
            self.waiting += 1
            self.running += 1
        deadline = time.monotonic() + self.delay_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            with self.lock:
                self.prompt_tokens += 128
                self.steps += 1
        with self.lock:
            self.waiting -= 1
            self.running -= 1


SECRET_KEY = "IlS_5HB-xhFIUyvRqtgYrbt5gtzz9-5KySPadp_ewILWFB8F"  # the tests' gateways' secret (unless set)


class Gateway:
    """`kvnotes gateway` on a free port in front of `upstream`, stopped by `stop()`; with
    `wait=False` the caller calls `ready()` (several gateways start side by side)."""

    def __init__(self, data: Path, upstream: str, *options: str, wait: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # one secret for every gateway of the tests, as the replicas of one deployment share one
        env = {"KVNOTES_SECRET_KEY": SECRET_KEY, **os.environ, **kvnotes_env(data), "PYTHONPATH": str(REPO)}
        data.mkdir(parents=True, exist_ok=True)
        self.log = data / "gateway.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "commands.cli", "gateway", "--upstream", upstream,
                                      "--port", str(self.port), *options], env=env, cwd=REPO,
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait until the gateway listens (60 s at most)."""
        if listening(self.port, 60, alive=lambda: self.proc.poll() is None):
            return
        self.stop()
        raise RuntimeError(f"the gateway did not start: {self.log.read_text()}")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="sk-test", max_retries=0, **kw)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics").text
        return next((sample.value for family in text_string_to_metric_families(text)
                     for sample in family.samples if sample.name == name and sample.labels == labels), 0.0)

    def eventually(self, name: str, value: float, **labels: str) -> bool:
        """Whether the series reaches `value` within 30 s (a stream is counted once its end passed)."""
        deadline = time.monotonic() + 30
        while self.metric(name, **labels) != value:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        stop_process(self.proc, 15)
