"""The transport under every serving backend (`serving.backend`): one OpenAI-compatible server as
the replay sees it: which model it serves, how long a prompt may be and whether the model has a
chat template, one streamed completion timed to its first token, bounded connections that a stop
shuts at once. What differs between engines (how tokens are counted, how the prefix cache is reset
and read, how an answer is constrained to choices) is left to the backend classes
(`serving.backend.VllmBackend`, `SglangBackend`), which override the hooks marked "engine" below.

A prompt is sent as kvnotes prefills it (`worker.engine.readout.Frame`): for a model with a chat
template, as the user message of that template (`/v1/chat/completions`, the server applies it); for
a model without one (a base model), as plain text ending in `PLAIN_TAIL` (`/v1/completions`).

Every failure becomes a `ReplayError`, never a traceback. What the replay decides itself names
the problem (the model not served, a prompt too long); anything the server does wrong (refused,
reset, silent, an error status, not JSON) reads the same, "the server at … did not answer as vLLM
does (what was asked)", and, with `quote` (the command line, run on the operator's own server), what
came back: the HTTP status and the first `QUOTED` characters of the body, or the exception. Without
it (the web and its worker) nothing the server said is quoted back, so a replay cannot be used to
read or map other services. Addresses a replay may never reach are refused before any connection
(`serving.targets`).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from serving import sse
from serving.failures import QUOTED, ReplayError, ReplayStopped, answered, base_url, quoted
from serving.progress import Follower, Progress, Watch
from vocabulary.prompt import PLAIN_TAIL, choice_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerInfo:
    """The served model's name, its longest prompt + answer (`max_model_len`) and whether prompts
    go through its chat template."""

    model: str
    max_model_len: int
    chat: bool = True

    @property
    def prompt_format(self) -> str:
        return "chat" if self.chat else "plain"


@dataclass(frozen=True)
class Completion:
    """One streamed answer: time to its first token and to its end (from sending), its text, and the
    server's usage (prompt tokens and how many of them came from the prefix cache)."""

    ttft_ms: float
    latency_ms: float
    text: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Counters:
    """vLLM's cumulative prefix-cache counters, in tokens."""

    queries: float
    hits: float


# what a request to an address can raise besides an answer (an address httpx or IDNA refuses included)
NETWORK_ERRORS = (httpx.HTTPError, httpx.InvalidURL, UnicodeError, OSError)
MAX_BODY = 16 << 20  # the largest answer read from the server (token ids of a long prompt, /metrics)
WATCH_EVERY_S = 0.2  # how often the watcher looks for a stop or a passed deadline
PROBE_S = 10.0  # the longest one reading of the server's progress may take (less for a short bound)
EXTRA_EVENTS = 8  # events of an answer besides one per token (its role, finish reason, usage)


class _TrackingBackend(httpcore.SyncBackend):
    """httpcore's network backend, remembering every socket it opens so `Server.stop` can shut them
    (which wakes a read blocked on a server that sends nothing). It connects in the thread that
    sends the request, so the request's `Watch` learns its socket before any answer comes."""

    def __init__(self, opened: Callable[[socket.socket], None]) -> None:
        self._opened = opened

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        stream = super().connect_tcp(*args, **kwargs)
        sock = stream.get_extra_info("socket")
        if sock is not None:
            self._opened(sock)
        return stream


class Server:
    """The transport of an OpenAI-compatible server at `url` serving `model` (None: the one model it
    serves). `chat`: send prompts through the model's chat template (None: when it has one, which
    `info` finds out).

    Bounded: `connect_s` to connect, at most `max_tokens` + `EXTRA_EVENTS` events in an answer, and
    `deadline_s` (None: none) for everything this server is asked. A request other than an answer
    (the models, tokenize, /metrics) has `request_s` to answer, by the read timeout and the watcher.

    An answer is bounded by silence, not by queueing (issue 52, `serving.progress`): it waits as long
    as the server shows progress (`progress`: its `/metrics`), and is cut once nothing came for
    `request_s` and the server's readings stood still as long, saying what they showed (issue 44: it
    is never cut while its tokens come). `stop()` or setting `stop_event` (a cancel) shuts every
    connection at once; the request in flight raises `ReplayStopped`. Every failure reads "the server
    at … did not answer as vLLM does", with what was asked; what the server said goes to the log,
    and to the caller only with `quote`."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 600.0,
                 chat: bool | None = None, connect_s: float = 10.0, deadline_s: float | None = None,
                 refused_ports: Iterable[int] = (), stop_event: threading.Event | None = None,
                 quote: bool = False):
        self.url = base_url(url, refused_ports, resolve=True)
        self.quote = quote
        self.model = model
        self.chat = chat
        self.request_s = timeout_s
        self._deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self._deadline_s = deadline_s
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._local = threading.local()  # the `Watch` of the request this thread sends
        self._stopped: str | None = None
        self._closed = threading.Event()
        self._stopping = threading.Event()
        self._stop_event = stop_event
        self._client = self._new_client(httpx.Timeout(timeout_s, connect=connect_s))
        # answers: a fresh connection each (so the watcher knows its socket before the first byte),
        # and no read timeout (the watcher bounds their silence); the progress reader's, its own
        self._answers = self._new_client(httpx.Timeout(None, connect=connect_s, write=timeout_s),
                                         httpx.Limits(max_keepalive_connections=0))
        self._probe = self._new_client(httpx.Timeout(min(PROBE_S, max(1.0, timeout_s))))
        self._follower = Follower(timeout_s, self.progress, self._closed)
        threading.Thread(target=self._watch, name="replay-watch", daemon=True).start()

    def _new_client(self, timeout: httpx.Timeout, limits: httpx.Limits | None = None) -> httpx.Client:
        transport = httpx.HTTPTransport(retries=0, **({"limits": limits} if limits else {}))
        pool = getattr(transport, "_pool", None)
        if isinstance(pool, httpcore.ConnectionPool):
            pool._network_backend = _TrackingBackend(self._opened)
        return httpx.Client(base_url=self.url, transport=transport, trust_env=False,
                            follow_redirects=False, timeout=timeout)

    def close(self) -> None:
        self._closed.set()
        self._client.close()
        self._answers.close()
        self._probe.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- bounds ------------------------------------------------------------------------------------

    def _opened(self, sock: socket.socket) -> None:
        watch = getattr(self._local, "watch", None)
        if watch is not None:
            self._follower.connected(watch, sock)
        with self._lock:
            self._sockets.add(sock)
            stopped = self._stopped
        if stopped:
            _shut(sock)

    def stop(self, reason: str) -> None:
        """Stop everything: no request is sent after this, and those in flight end now."""
        with self._lock:
            self._stopped = self._stopped or reason
            sockets = list(self._sockets)
        self._stopping.set()
        for sock in sockets:
            _shut(sock)

    def pause(self, seconds: float) -> None:
        """Wait `seconds` (the next arrival), or raise `ReplayStopped` as soon as the replay stops."""
        if self._stopping.wait(max(0.0, seconds)):
            raise ReplayStopped(self._stopped or "stopped")

    def _watch(self) -> None:
        while not self._closed.wait(WATCH_EVERY_S):
            now = time.monotonic()
            if self._stop_event is not None and self._stop_event.is_set() and not self._stopped:
                self.stop("the replay was cancelled")
            if self._deadline is not None and now > self._deadline and not self._stopped:
                self.stop(f"the replay ran past its deadline of {self._deadline_s:g} s")
            for sock in self._follower.late(now):
                _shut(sock)

    def _probe_get(self, path: str) -> bytes | None:
        """The body of `GET path` on the progress reader's own connection, bounded by `PROBE_S` (or
        `request_s`); None unless the server answers it 200, within `MAX_BODY`, in time."""
        try:
            with self._probe.stream("GET", path) as response:
                data = bytearray()
                for chunk in response.iter_bytes() if response.status_code == 200 else ():
                    data += chunk
                    if len(data) > MAX_BODY:
                        return None
                return bytes(data) if response.status_code == 200 else None
        except NETWORK_ERRORS:
            return None

    def _check_stopped(self) -> None:
        if self._stopped:
            raise ReplayStopped(self._stopped)

    def _failure(self, asked: str, detail: str, ours: str = "") -> ReplayError:
        """The one answer for every way a server can fail, or the stop that caused it. `ours`: what
        the replay itself found (a silence), said whether or not it quotes the server."""
        if self._stopped:
            return ReplayStopped(self._stopped)
        log.info("replay server failed", extra={"url": self.url, "asked": asked, "detail": detail[:500]})
        said = ": " + detail.replace("\r", "\\r").replace("\n", "\\n") if self.quote else ""
        found = f": {ours}" if ours else ""
        return ReplayError(f"the server at {self.url} did not answer as {self.engine} does ({asked}){found}"
                           f"{said if not ours else ''}")

    @contextmanager
    def _stream(self, method: str, path: str, body: dict | None = None,
                waits: bool = False) -> Iterator[httpx.Response]:
        """One request, its answer streamed, bounded by `request_s` from now (`_going_on` moves the
        bound on; with `waits`, an answer's, the server's progress does too); a `ReplayError` when it
        cannot be sent, breaks off or runs past a bound."""
        self._check_stopped()
        asked = f"{method} {path}"
        watch = Watch(time.monotonic() + self.request_s, waits)
        self._local.watch = watch
        self._follower.add(watch)
        try:
            client = self._answers if waits else self._client
            with client.stream(method, path, json=body) as response:
                stream = response.extensions.get("network_stream")
                sock = stream.get_extra_info("socket") if stream is not None else None
                self._follower.connected(watch, sock)
                response.extensions["kvnotes_watch"] = watch
                yield response
        except NETWORK_ERRORS as exc:
            said = f"{type(exc).__name__}: {exc or 'no message'}"
            if watch.cut:
                raise self._failure(asked, said, ours=watch.cut) from None
            if time.monotonic() > watch.due:  # the read timeout, or the watcher shut the socket
                said = f"nothing came within the request's bound of {self.request_s:g} s ({said})"
            raise self._failure(asked, said) from None
        finally:
            self._local.watch = None
            self._follower.drop(watch)

    def _going_on(self, response: httpx.Response) -> None:
        """A token came: the answer has `request_s` again for its next one."""
        watch = response.extensions.get("kvnotes_watch")
        if watch is not None:
            self._follower.going_on(watch)

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        """The status and body (at most MAX_BODY bytes) of one request."""
        with self._stream(method, path, body) as response:
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_BODY:
                    raise self._failure(f"{method} {path}", f"answer over {MAX_BODY} bytes")
            return response.status_code, bytes(data)

    def _get_json(self, path: str) -> dict:
        status, data = self._request("GET", path)
        if status != 200:
            raise self._failure(f"GET {path}", answered(status, data))
        return self._json(data, f"GET {path}")

    def _json(self, data: bytes, asked: str) -> dict:
        try:
            parsed = json.loads(data)
        except ValueError:
            raise self._failure(asked, f"not JSON: {quoted(data)!r}") from None
        if not isinstance(parsed, dict):
            raise self._failure(asked, f"{type(parsed).__name__}, not a JSON object")
        return parsed

    # --- what the replay asks ----------------------------------------------------------------------

    def info(self) -> ServerInfo:
        """The served model (checked against `model`) and its max_model_len."""
        cards = self._get_json("/v1/models").get("data")
        if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
            raise self._failure("GET /v1/models", "no list of model cards")
        served = {str(card.get("id")): card for card in cards}
        if self.model is None:
            if len(served) != 1:
                raise ReplayError(f"{self.url} serves {len(served)} models ({', '.join(served) or 'none'}); "
                                  "name one with --model", "model")
            self.model = next(iter(served))
        if self.model not in served:
            raise ReplayError(f"model {self.model!r} is not served by {self.url}; it serves: "
                              f"{', '.join(served) or 'no model'}", "model")
        if self.chat is None:
            self.chat = self._has_chat_template()
        try:
            max_model_len = int(served[self.model].get("max_model_len") or 0)
        except (TypeError, ValueError):
            raise self._failure("GET /v1/models", "max_model_len is not a number") from None
        return ServerInfo(self.model, max_model_len, self.chat)

    def _prompt(self, content: str) -> dict:
        """The request body's prompt part for `content`, chat or plain."""
        if self.chat is False:
            return {"prompt": content + PLAIN_TAIL}
        return {"messages": _messages(content)}

    # --- engine hooks: serving.backend.EngineBackend and its engines fill these in ---------------

    engine = "an OpenAI-compatible server"

    def _has_chat_template(self) -> bool:
        raise NotImplementedError

    def progress(self) -> Progress | None:
        """What the server's `/metrics` shows of its work now (None: nothing, or no such metrics)."""
        return None

    def models(self) -> dict:
        """The engine's `/v1/models` answer, as it gave it (a JSON object)."""
        return self._get_json("/v1/models")

    def constraint(self, choices: tuple[str, ...]) -> dict:
        """The request body's part that constrains the answer to one of `choices`."""
        raise NotImplementedError

    def complete(self, content: str, max_tokens: int, choices: tuple[str, ...] = ()) -> Completion:
        """Stream one greedy completion (chat or plain, as the model takes prompts), constrained to one
        of `choices` when there are any (vLLM's structured outputs: the decision over the choices, as
        kvnotes reads it); raises `ReplayError` when it fails, breaks off or runs past its bounds: no
        token for `request_s` while the server shows no progress either (see the class), and at most
        `max_tokens` + `EXTRA_EVENTS` events."""
        body = {"model": self.model, **self._prompt(content), "max_tokens": max_tokens,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        if choices:  # a base model's answer follows "Answer:" after a space, as Frame.choice_text writes it
            body.update(self.constraint(tuple(choice_text(c, self.chat is not False) for c in choices)))
        path = "/v1/completions" if self.chat is False else "/v1/chat/completions"
        asked = f"POST {path}"
        sent = time.perf_counter()
        first, parts, usage = None, [], None
        with self._stream("POST", path, body, waits=True) as response:
            watch = response.extensions["kvnotes_watch"]
            if response.status_code != 200:
                raise self._failure(asked, answered(response.status_code, response.read()))
            for events, chunk in enumerate(self._events(response, asked), 1):
                if events > max_tokens + EXTRA_EVENTS:
                    raise self._failure(asked, f"more than {max_tokens + EXTRA_EVENTS} events for an answer "
                                               f"of at most {max_tokens} tokens")
                usage = chunk.usage or usage
                if chunk.token:
                    first = first or time.perf_counter()
                    self._going_on(response)
                parts.append(chunk.text)
        if first is None or usage is None:
            if watch.cut:  # the watcher shut it
                raise self._failure(asked, watch.cut, ours=watch.cut)
            raise self._failure(asked, "the stream ended before an answer and its usage arrived")
        done = time.perf_counter()
        return Completion((first - sent) * 1000, (done - sent) * 1000, "".join(parts),
                          usage.prompt_tokens, usage.cached_tokens)

    def _events(self, response: httpx.Response, asked: str) -> Iterator[sse.Chunk]:
        """The chunks of a server-sent event stream (the one reader, `serving.sse`), up to `[DONE]`."""
        for event in sse.events(response):
            self._check_stopped()
            chunk = sse.read(event.data)
            if chunk.done:
                return
            if chunk.parsed is None:
                raise self._failure(asked, f"an event that is not a JSON object: {event.data[:QUOTED]!r}")
            if chunk.error:
                raise self._failure(asked, f"an error mid-stream: {event.data[:QUOTED]!r}")
            yield chunk


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]
