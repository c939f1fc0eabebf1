"""A client's own OpenAI request forwarded to a serving engine, as it is, streamed or not: the
backend protocol's "send a chat or completion request, streamed, with its time to first token" for
the erratum gateway (`Backend.relay`).

`async with relay(url, path, body, timeout_s) as r:` sends it; `r.status` is the engine's status;
`r.chunks()` yields the answer's bytes as they come (a stream's server-sent events, or the JSON
body), and, while they pass, `r.outcome` gathers the time to the first token, the answer's text and
the engine's usage (prompt tokens, and how many came from its prefix cache). A streamed request
asks the engine for its usage (`stream_options.include_usage`); when the client did not ask for it,
the usage-only event is kept from the client.

Bounded: nothing waits past `timeout_s` from sending (connect, first byte, every later read); a
bound passed or a connection lost raises `UpstreamError` with the status a client should see (504
for a bound, 502 otherwise) and a message naming the engine's address, never what it said. Leaving
the `async with` early (the client went away) closes the connection, which makes the engine abort
the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx


class UpstreamError(Exception):
    """The engine could not be reached, broke off or ran past the bound: `status` for the client."""

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
                 client: httpx.AsyncClient | None = None) -> None:
        self.url, self.path, self.timeout_s = url.rstrip("/"), path, timeout_s
        self._shared = client
        self.stream = bool(body.get("stream"))
        self.hide_usage = False
        if self.stream:
            options = dict(body.get("stream_options") or {})
            self.hide_usage = not options.get("include_usage")
            body = {**body, "stream_options": {**options, "include_usage": True}}
        self.body = body
        self.outcome = Outcome()
        self.status = 0
        self.content_type = "application/json"
        self._client: httpx.AsyncClient | None = None
        self._response: httpx.Response | None = None
        self._sent = 0.0

    def _left(self) -> float:
        left = self.timeout_s - (time.perf_counter() - self._sent)
        if left <= 0:
            raise UpstreamError(504, f"the serving engine at {self.url} did not answer within "
                                     f"{self.timeout_s:g} s")
        return left

    async def __aenter__(self) -> Relay:
        client = self._shared or new_client(self.timeout_s)
        self._client = None if self._shared else client
        self._sent = time.perf_counter()
        request = client.build_request("POST", self.url + self.path, json=self.body,
                                       timeout=httpx.Timeout(self.timeout_s))
        try:
            self._response = await asyncio.wait_for(client.send(request, stream=True), self._left())
        except (TimeoutError, httpx.TimeoutException):
            await self.aclose()
            raise UpstreamError(504, f"the serving engine at {self.url} did not answer within "
                                     f"{self.timeout_s:g} s") from None
        except (httpx.HTTPError, OSError) as exc:
            await self.aclose()
            raise UpstreamError(502, f"the serving engine at {self.url} could not be reached "
                                     f"({type(exc).__name__})") from None
        self.status = self._response.status_code
        self.content_type = self._response.headers.get("content-type", self.content_type)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()
        if self._client is not None:
            await self._client.aclose()

    async def _raw(self) -> AsyncIterator[bytes]:
        assert self._response is not None
        pieces = self._response.aiter_raw() if not self.stream else self._response.aiter_lines()
        while True:
            try:
                piece = await asyncio.wait_for(anext(pieces), self._left())
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.TimeoutException):
                raise UpstreamError(504, f"the serving engine at {self.url} stopped answering within "
                                         f"{self.timeout_s:g} s") from None
            except (httpx.HTTPError, OSError) as exc:
                raise UpstreamError(502, f"the serving engine at {self.url} broke off its answer "
                                         f"({type(exc).__name__})") from None
            yield piece.encode() if isinstance(piece, str) else piece

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's bytes for the client, measured as they pass."""
        if not self.stream or self.status != 200:
            data = bytearray()
            async for piece in self._raw():
                data += piece
            self._read_body(bytes(data))
            yield bytes(data)
            return
        async for line in self._raw():
            if self._read_event(line):
                yield line + b"\n\n"

    async def read(self) -> bytes:
        """The whole answer (what `chunks` yields, joined)."""
        return b"".join([piece async for piece in self.chunks()])

    def _first(self) -> None:
        if self.outcome.ttft_ms is None:
            self.outcome.ttft_ms = (time.perf_counter() - self._sent) * 1000

    def _usage(self, usage: object) -> None:
        if isinstance(usage, dict):
            self.outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.outcome.cached_tokens = int((details.get("cached_tokens") if isinstance(details, dict)
                                              else 0) or 0)

    def _read_body(self, data: bytes) -> None:
        self.outcome.latency_ms = (time.perf_counter() - self._sent) * 1000
        try:
            parsed = json.loads(data)
        except ValueError:
            return
        if not isinstance(parsed, dict):
            return
        self._usage(parsed.get("usage"))
        for choice in (parsed.get("choices") or [])[:1]:
            if isinstance(choice, dict):
                message = choice.get("message") or {}
                self.outcome.text = str((message.get("content") if isinstance(message, dict) else None)
                                        or choice.get("text") or "")

    def _read_event(self, line: bytes) -> bool:
        """Read one line of the event stream; whether the client gets it (a blank line separates
        events and is added back after each)."""
        text = line.decode(errors="replace").strip()
        if not text.startswith("data:"):
            return bool(text)
        data = text[5:].strip()
        if data == "[DONE]":
            self.outcome.done = True
            self.outcome.latency_ms = (time.perf_counter() - self._sent) * 1000
            self.outcome.text = "".join(self.outcome.parts)
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        self._usage(chunk.get("usage"))
        choices = chunk.get("choices") or []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            piece = (delta.get("content") if isinstance(delta, dict) else None) or choice.get("text") or ""
            if piece or choice.get("finish_reason"):
                self._first()
            self.outcome.parts.append(piece)
        return not (self.hide_usage and not choices and chunk.get("usage"))


def new_client(timeout_s: float) -> httpx.AsyncClient:
    """A connection pool to the engine (one per event loop: making one costs tens of milliseconds)."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=httpx.Timeout(timeout_s),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


def relay(url: str, path: str, body: dict, timeout_s: float,
          client: httpx.AsyncClient | None = None) -> Relay:
    """`Relay(url, path, body, timeout_s, client)`: use it with `async with`."""
    return Relay(url, path, body, timeout_s, client)
