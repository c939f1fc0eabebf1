"""How many requests one web process serves at once, sized with its database pool.

Each request holds at most one database connection, so the app lets `KVNOTES_DB_POOL_SIZE` requests
in at once; up to `KVNOTES_REQUEST_QUEUE` more wait (in the event loop, holding no thread and no
connection) for at most `KVNOTES_REQUEST_WAIT_S`. Past that the answer is 503 with `Retry-After`
at once: a crowd gets slower answers or a clear "busy", never a 500 after a 30 s pool timeout.
`/api/health` and static files are never held back: health must answer while the app is saturated.
Nor is the gateway's API (`/gateway/v1/`, `/gateway/metrics`): it has slots of its own
(`app.gateway.slots`), so a user's slow upstream never takes the slots the pages need.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from data.settings import get_settings

EXEMPT_PATHS = frozenset({"/api/health"})
# the gateway's API has slots of its own (`app.gateway.slots`): its requests may be held for minutes
EXEMPT_PREFIXES = ("/static/", "/gateway/v1/", "/gateway/metrics")
RETRY_AFTER_S = 2
BUSY = ("the server is busy (every database connection is in use and the waiting line is full); "
        "try again shortly")


def busy_answer(path: str, accept: str) -> tuple[str, bytes]:
    """The content type and body of a 503 'busy': JSON for the API, a line of HTML for a page."""
    if path.startswith("/api") or path.endswith(".json") or "application/json" in accept:
        return "application/json", json.dumps({"detail": BUSY}).encode()
    return "text/html; charset=utf-8", f'<p class="form-error" role="alert">{BUSY}</p>'.encode()


class CapacityLimit:
    """Pure ASGI middleware: a semaphore of `db_pool_size` slots and a bounded wait for one."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.waiting = 0
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:  # a test client may run each call in a new loop
            self._slots, self._loop = asyncio.Semaphore(get_settings().db_pool_size), loop
        return self._slots

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in EXEMPT_PATHS or path.startswith(EXEMPT_PREFIXES):
            await self.app(scope, receive, send)
            return
        if not await self._enter():
            await self._refuse(scope, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._semaphore().release()

    async def _enter(self) -> bool:
        """True once a slot is held; False when the line is full or the wait ran out."""
        slots, settings = self._semaphore(), get_settings()
        if slots.locked() and self.waiting >= settings.request_queue:
            return False
        self.waiting += 1
        try:
            await asyncio.wait_for(slots.acquire(), settings.request_wait_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1

    async def _refuse(self, scope: dict, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        content_type, body = busy_answer(scope.get("path", ""), headers.get("accept", ""))
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", content_type.encode()), (b"retry-after", str(RETRY_AFTER_S).encode()),
            (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": body})
