"""A client's own OpenAI request forwarded to a serving engine, as it is, streamed or not: the
backend protocol's "send a chat or completion request, streamed, with its time to first token" for
the erratum gateway (`Backend.relay`).

`async with relay(url, path, body, timeout_s, idle_s=...) as r:` sends it; `r.status` is the engine's
status; `r.chunks()` yields the answer's bytes as they come (a stream's server-sent events, read by
the one reader `serving.sse`, or the JSON body), and, while they pass, `r.outcome` gathers the time
to the first token, the answer's text and the engine's usage (prompt tokens, and how many came from
its prefix cache). A streamed request asks the engine for its usage (`stream_options.include_usage`);
when the client did not ask for it, the usage-only event is kept from the client.

Bounded, in a way that fits streams: `timeout_s` from sending to the answer's first byte (connect,
the status, the first event or the first piece of a body), then `idle_s` between one piece and the
next; a healthy stream has no deadline. A bound passed or a connection lost raises `UpstreamError`
with the status a client should see (504 for a bound, 502 otherwise) and a message naming the
engine's address, never what it said. Leaving the `async with` early (the client went away) closes
the connection, which makes the engine abort the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from serving import sse


class UpstreamError(Exception):
    """The engine could not be reached, broke off or ran past a bound: `status` for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Outcome:
    """What a relayed answer measured: time to its first token (None until one came), its text (the
    first choice's), the engine's usage."""

    ttft_ms: float | None = None
    latency_ms: float | None = None
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    done: bool = False  # the stream's `data: [DONE]` was read
    parts: list[str] = field(default_factory=list, repr=False)


class Relay:
    """One forwarded request (see the module docstring)."""

    def __init__(self, url: str, path: str, body: dict, timeout_s: float,
                 client: httpx.AsyncClient | None = None, idle_s: float | None = None) -> None:
        self.url, self.path, self.timeout_s = url.rstrip("/"), path, timeout_s
        self.idle_s = timeout_s if idle_s is None else idle_s
        self._shared = client
        self.stream = bool(body.get("stream"))
        self.hide_usage = False
        if self.stream:
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            self.hide_usage = not options.get("include_usage")
            body = {**body, "stream_options": {**options, "include_usage": True}}
        self.body = body
        self.outcome = Outcome()
        self.status = 0
        self.content_type = "application/json"
        self._client: httpx.AsyncClient | None = None
        self._response: httpx.Response | None = None
        self._sent = 0.0
        self._first_byte = False

    def _bound(self) -> float:
        """Seconds the next read may take: to the first byte's deadline, then the idle limit."""
        if self._first_byte:
            return self.idle_s
        return max(0.0, self.timeout_s - (time.perf_counter() - self._sent))

    def _late(self) -> UpstreamError:
        if self._first_byte:
            return UpstreamError(504, f"the serving engine at {self.url} sent nothing for {self.idle_s:g} s "
                                      "in the middle of its answer (the idle limit)")
        return UpstreamError(504, f"the serving engine at {self.url} did not answer within "
                                  f"{self.timeout_s:g} s")

    async def __aenter__(self) -> Relay:
        client = self._shared or new_client(self.timeout_s)
        self._client = None if self._shared else client
        self._sent = time.perf_counter()
        # the bounds are this class's (the first byte, then idle); httpx's own only guard a connect
        timeout = httpx.Timeout(connect=self.timeout_s, read=None, write=self.timeout_s, pool=self.timeout_s)
        request = client.build_request("POST", self.url + self.path, json=self.body, timeout=timeout)
        try:
            async with asyncio.timeout(self._bound()):
                self._response = await client.send(request, stream=True)
        except (TimeoutError, httpx.TimeoutException):
            await self.aclose()
            raise self._late() from None
        except (httpx.HTTPError, OSError) as exc:
            await self.aclose()
            raise UpstreamError(502, f"the serving engine at {self.url} could not be reached "
                                     f"({type(exc).__name__})") from None
        self.status = self._response.status_code
        self.content_type = self._response.headers.get("content-type", self.content_type)
        self.stream = self.stream and self.status == 200 and sse.is_stream(self._response)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()
        if self._client is not None:
            await self._client.aclose()

    async def _bounded(self, pieces: AsyncIterator) -> AsyncIterator:
        """`pieces` (body bytes or events), each within its bound; a bound passed or a connection lost
        raises `UpstreamError`."""
        while True:
            try:
                async with asyncio.timeout(self._bound()):
                    piece = await anext(pieces)
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.TimeoutException):
                raise self._late() from None
            except (httpx.HTTPError, OSError) as exc:
                raise UpstreamError(502, f"the serving engine at {self.url} broke off its answer "
                                         f"({type(exc).__name__})") from None
            self._first_byte = True
            yield piece

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's bytes for the client, measured as they pass."""
        assert self._response is not None
        if not self.stream:
            data = bytearray()
            async for piece in self._bounded(self._response.aiter_raw()):
                data += piece
            self._read_body(bytes(data))
            yield bytes(data)
            return
        async for event in self._bounded(sse.aevents(self._response)):
            if self._read_event(sse.read(event.data)):
                yield sse.wire(event)

    async def read(self) -> bytes:
        """The whole answer (what `chunks` yields, joined)."""
        return b"".join([piece async for piece in self.chunks()])

    def _usage(self, usage: sse.Usage | None) -> None:
        if usage is not None:
            self.outcome.prompt_tokens, self.outcome.cached_tokens = usage.prompt_tokens, usage.cached_tokens

    def _read_body(self, data: bytes) -> None:
        self.outcome.latency_ms = (time.perf_counter() - self._sent) * 1000
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError):
            return
        if not isinstance(parsed, dict):
            return
        self._usage(sse.usage_of(parsed.get("usage")))
        choices = parsed.get("choices")
        for choice in (choices if isinstance(choices, list) else [])[:1]:
            if isinstance(choice, dict):
                message = choice.get("message") or {}
                self.outcome.text = str((message.get("content") if isinstance(message, dict) else None)
                                        or choice.get("text") or "")

    def _read_event(self, chunk: sse.Chunk) -> bool:
        """Read one event of the stream; whether the client gets it."""
        if chunk.done:
            self.outcome.done = True
            self.outcome.latency_ms = (time.perf_counter() - self._sent) * 1000
            self.outcome.text = "".join(self.outcome.parts)
            return True
        self._usage(chunk.usage)
        if chunk.token and self.outcome.ttft_ms is None:
            self.outcome.ttft_ms = (time.perf_counter() - self._sent) * 1000
        self.outcome.parts.append(chunk.text)
        return not (self.hide_usage and chunk.usage_only)


def new_client(timeout_s: float) -> httpx.AsyncClient:
    """A connection pool to the engine (one per event loop: making one costs tens of milliseconds)."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=httpx.Timeout(timeout_s),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


def relay(url: str, path: str, body: dict, timeout_s: float,
          client: httpx.AsyncClient | None = None, idle_s: float | None = None) -> Relay:
    """`Relay(url, path, body, timeout_s, client, idle_s)`: use it with `async with`."""
    return Relay(url, path, body, timeout_s, client, idle_s)
