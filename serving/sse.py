"""The one reader of an OpenAI-compatible server's event stream (a streamed chat or completion
answer), for the gateway's relay (`serving.relay`, async) and the replay's transport
(`serving.server`, sync): `httpx-sse` splits the stream into events (`events`, `aevents`), `read`
reads one event's data into a `Chunk`, `wire` writes an event back as the client gets it.

A chunk is what both readers need of an event: the end (`data: [DONE]`), the first choice's text
piece, whether a token or a finish reason came (the time to the first token is taken there), the
usage (prompt tokens, and how many came from the engine's prefix cache), an error the server sent
mid-stream. Data that is not a JSON object is a chunk with `parsed` None (passed on, read as nothing).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
from httpx_sse import EventSource, ServerSentEvent

DONE = "[DONE]"
MEDIA_TYPE = "text/event-stream"


@dataclass(frozen=True)
class Usage:
    """The engine's usage: prompt tokens, and how many of them came from its prefix cache."""

    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Chunk:
    """One event of a streamed answer (see the module docstring)."""

    done: bool = False
    parsed: dict | None = None
    text: str = ""
    token: bool = False  # a text piece or a finish reason for the first choice: the first token's time
    usage: Usage | None = None
    usage_only: bool = False  # no choices, only the usage (the event `include_usage` adds)

    @property
    def error(self) -> bool:
        return self.parsed is not None and "error" in self.parsed


def is_stream(response: httpx.Response) -> bool:
    """Whether the answer is an event stream (by its content type)."""
    return MEDIA_TYPE in response.headers.get("content-type", "").partition(";")[0]


def events(response: httpx.Response) -> Iterator[ServerSentEvent]:
    """The events of a streamed answer (comments and empty events skipped)."""
    return EventSource(response).iter_sse()


def aevents(response: httpx.Response) -> AsyncIterator[ServerSentEvent]:
    """`events` for an async response."""
    return EventSource(response).aiter_sse()


def usage_of(value: object) -> Usage | None:
    """A `usage` object as the engine writes it (non-streamed answers carry one too)."""
    if not isinstance(value, dict):
        return None
    details = value.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return Usage(_count(value.get("prompt_tokens")), _count(cached))


def _count(value: object) -> int:
    try:
        return max(0, int(value or 0))  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0


def read(data: str) -> Chunk:
    """One event's data as a `Chunk`."""
    if data.strip() == DONE:
        return Chunk(done=True)
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return Chunk()
    if not isinstance(parsed, dict):
        return Chunk()
    choices = parsed.get("choices")
    choices = choices if isinstance(choices, list) else []
    text, token = "", False
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        piece = (delta.get("content") if isinstance(delta, dict) else None) or choice.get("text") or ""
        piece = piece if isinstance(piece, str) else ""
        text += piece
        token = token or bool(piece or choice.get("finish_reason"))
    usage = usage_of(parsed.get("usage"))
    return Chunk(False, parsed, text, token, usage, usage_only=not choices and usage is not None)


def wire(event: ServerSentEvent) -> bytes:
    """The event as the stream carries it (its data line by line, then a blank line)."""
    lines = [] if event.event == "message" else [f"event: {event.event}"]
    if event.id:
        lines.append(f"id: {event.id}")
    if event.retry is not None:
        lines.append(f"retry: {event.retry}")
    lines += [f"data: {line}" for line in event.data.split("\n")]
    return ("\n".join(lines) + "\n\n").encode()
