"""The browser protections, as one ASGI middleware around the whole app (static files included):

1. Host allowlist (`KVNOTES_ALLOWED_HOSTS`; default the loopback names and the bound address): any
   other `Host` gets 400. This is what stops DNS rebinding from reaching the local app.
2. Cross-site requests refused: a state-changing request (not GET/HEAD/OPTIONS) whose
   `Sec-Fetch-Site` is `cross-site`/`same-site`, or whose `Origin` is not this host, gets 403 —
   the rule of Go's `http.CrossOriginProtection`. Requests without either header come from a
   non-browser client (curl, scripts) and carry no ambient credentials; Bearer-token requests are
   not cookie-authenticated, so no CSRF can ride on them. Signed-in sessions are checked once more
   by `app.security.guard` (token when neither header is sent).
3. Request bodies above `max_request_bytes` get 413 before they are read.
4. Security headers on every answer: a Content-Security-Policy with no inline script (scripts
   come from /static only), `frame-ancestors 'none'`, nosniff, a same-origin Referrer-Policy,
   and HSTS when served over https. `Server-Timing: app;dur=<ms>` says how long the app took to
   start its answer (what bench/load_pages.py reads to tell server time from a busy machine's queue). A route that sets one of these headers itself keeps its own
   (the standalone run report sends a stricter CSP that allows only its own inline script, by hash).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from data.settings import get_settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
       "frame-ancestors 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
HSTS = (b"strict-transport-security", b"max-age=31536000")
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None]:
    """'Example.org:8000' → ('example.org', 8000); '[::1]:80' → ('::1', 80); bad ports → -1."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    if not port:
        return host.rstrip("."), None
    return host.rstrip("."), int(port) if port.isdigit() and len(port) <= 5 else -1


def host_allowed(host_header: str, allowed: list[str]) -> bool:
    host, port = split_host(host_header)
    if not host or port == -1:
        return False
    for pattern in allowed:
        pattern = pattern.strip("[]")
        if pattern == "*" or host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


def same_origin(origin: str, host_header: str) -> bool:
    """Does `Origin` name the host the request was sent to (ports compared, defaults filled in)?"""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    host, port = split_host(host_header)
    return parts.hostname.lower() == host and (port or DEFAULT_PORTS[parts.scheme]) == origin_port


def cross_site_reason(method: str, headers: Headers) -> str | None:
    """Why a request must be refused as cross-site, or None."""
    if method in SAFE_METHODS or headers.get("authorization", "").lower().startswith("bearer "):
        return None
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site in ("cross-site", "same-site"):
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
    origin = headers.get("origin")
    if origin is not None and not same_origin(origin, headers.get("host", "")):
        return f"cross-site request refused (Origin {origin[:100]} is not this site)"
    return None


class SecurityMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = get_settings()
        headers = Headers(scope=scope)
        secure = settings.https or scope.get("scheme") == "https"
        started = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = f"app;dur={(time.perf_counter() - started) * 1000:.1f}".encode()
                own = {bytes(name).lower() for name, _ in message.get("headers", [])}  # a route's own policy wins
                extra = [h for h in HEADERS if h[0] not in own]
                message["headers"] = [*message.get("headers", []), *extra, *([HSTS] if secure else []),
                                      (b"server-timing", took)]
            await send(message)

        host = headers.get("host", "")
        if not host_allowed(host, settings.allowed_hosts):
            await _refuse(send_with_headers, 400, f"Host {host[:100]!r} is not allowed (KVNOTES_ALLOWED_HOSTS)")
            return
        reason = cross_site_reason(scope["method"], headers)
        if reason:
            await _refuse(send_with_headers, 403, reason)
            return
        length = headers.get("content-length", "")
        limit = settings.max_request_bytes
        if length.isdigit() and int(length) > limit:
            await _refuse(send_with_headers, 413, f"the request body is larger than {limit} bytes")
            return
        await self.app(scope, _limited(receive, limit), send_with_headers)


def _limited(receive: Receive, limit: int) -> Receive:
    """`receive` that stops a body (chunked, without Content-Length) growing past `limit`."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return wrapped


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    start: dict[str, Any] = {"type": "http.response.start", "status": status,
                             "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": body})
