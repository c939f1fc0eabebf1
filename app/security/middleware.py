"""The browser protections, as one ASGI middleware around the whole app (static files included):

1. Host allowlist (`KVNOTES_ALLOWED_HOSTS`; default the loopback names and the bound address): any
   other `Host`, or more than one `Host`, `Origin` or `Sec-Fetch-Site` header (read first-wins, two
   could disagree), gets 400. This is what stops DNS rebinding from reaching the local app.
2. Cross-site requests refused: a state-changing request (not GET/HEAD/OPTIONS) whose
   `Sec-Fetch-Site` is anything but `same-origin` (`cross-site`, `same-site`, `none`, garbage), or
   whose `Origin` is not this scheme, host and port, gets 403 — the rule of Go's
   `http.CrossOriginProtection`, stricter on `none`. Requests without either header come from a
   non-browser client (curl, scripts) and carry no ambient credentials; requests with a well-formed
   Bearer token are not cookie-authenticated, so no CSRF can ride on them, while a malformed
   `Authorization: Bearer …` is refused (401) rather than ignored. Signed-in sessions are checked
   once more by `app.security.guard` (token when neither header is sent).
3. Request bodies above `max_request_bytes` get 413 before the app sees them: by Content-Length,
   or, for a chunked body without one, read up to the limit here first.
4. Security headers on every answer: a Content-Security-Policy with no inline script (scripts
   come from /static only), `frame-ancestors 'none'`, nosniff, a same-origin Referrer-Policy,
   `Cache-Control: no-store` on everything but /static (answers show one user's data), and HSTS
   when served over https. `Server-Timing: app;dur=<ms>` says how long the app took to start its
   answer (what bench/load_pages.py reads to tell server time from a busy machine's queue). A route
   that sets one of these headers itself keeps its own (the standalone run report sends a stricter
   CSP that allows only its own inline script, by hash).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.security.principal import MalformedAuthorization, parse_bearer
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
NO_STORE = (b"cache-control", b"no-store")
STATIC_PREFIX = "/static/"
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


def same_origin(origin: str, host_header: str, scheme: str = "http") -> bool:
    """Does `Origin` name the scheme, host and port the request was sent to (default ports filled in)?"""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    if parts.scheme != scheme or scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    host, port = split_host(host_header)
    return parts.hostname.lower() == host and (port or DEFAULT_PORTS[scheme]) == origin_port


def cross_site_reason(method: str, headers: Headers, scheme: str = "http") -> str | None:
    """Why a request must be refused as cross-site, or None. Call `parse_bearer` first: a malformed
    Bearer header is refused before this."""
    if method in SAFE_METHODS or parse_bearer(headers.get("authorization")) is not None:
        return None
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site[:40]})"
    origin = headers.get("origin")
    if origin is not None and not same_origin(origin, headers.get("host", ""), scheme):
        return f"cross-site request refused (Origin {origin[:100]} is not this site)"
    return None


def refusal(scope: Scope, headers: Headers, scheme: str) -> tuple[int, str] | None:
    """(status, reason) when the request is refused before the app sees it: its Host, its
    Authorization header, or a cross-site origin."""
    settings = get_settings()
    names = [name.lower() for name, _value in scope.get("headers", [])]
    for single in (b"host", b"origin", b"sec-fetch-site"):  # read first-wins, two could disagree
        if names.count(single) > 1:
            return 400, f"more than one {single.decode().title()} header"
    host = headers.get("host", "")
    if not host_allowed(host, settings.allowed_hosts):
        return 400, f"Host {host[:100]!r} is not allowed (KVNOTES_ALLOWED_HOSTS)"
    try:
        parse_bearer(headers.get("authorization"))
    except MalformedAuthorization as exc:
        return 401, str(exc)
    reason = cross_site_reason(scope["method"], headers, scheme)
    return (403, reason) if reason else None


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
        private = () if scope.get("path", "").startswith(STATIC_PREFIX) else (NO_STORE,)
        started = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = f"app;dur={(time.perf_counter() - started) * 1000:.1f}".encode()
                # a route's own policy wins
                own = {bytes(name).lower() for name, _ in message.get("headers", [])}
                extra = [h for h in (*HEADERS, *private) if h[0] not in own]
                message["headers"] = [*message.get("headers", []), *extra, *([HSTS] if secure else []),
                                      (b"server-timing", took)]
            await send(message)

        refused = refusal(scope, headers, "https" if secure else "http")
        if refused:
            await _refuse(send_with_headers, *refused)
            return
        length = headers.get("content-length", "")
        limit = settings.max_request_bytes
        if length.isdigit() and int(length) > limit:
            await _refuse(send_with_headers, 413, f"the request body is larger than {limit} bytes")
            return
        if not length and scope["method"] not in SAFE_METHODS:  # chunked: read it here, up to the limit
            body = await _read_body(receive, limit)
            if body is None:
                await _refuse(send_with_headers, 413, f"the request body is larger than {limit} bytes")
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send_with_headers)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it grows past `limit` bytes."""
    chunks, seen, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` that hands the app `body` in one message, then waits on the client as before."""
    sent = False

    async def wrapped() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    start: dict[str, Any] = {"type": "http.response.start", "status": status,
                             "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": body})
