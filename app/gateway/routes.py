"""The erratum gateway's HTTP side: the OpenAI API (`/chat/completions`, `/completions`, `/models`,
streamed and not) in front of the configured upstreams (`serving.gateway.router` picks one per
request; one that cannot be reached is skipped for the next), and `/metrics` in Prometheus text.

`router` is served at `/v1` by `kvnotes gateway` (`app.gateway.main`) and at `/gateway/v1` by
`kvnotes serve` (`app.main`, behind its accounts and tokens). Every answer carries
`x-kvnotes-gateway`: the layout a request was rewritten with, or `pass-through; reason=…`, and
`x-kvnotes-tenant`: how its tenant was told (`serving.gateway.tenants`; `none`: no rewriting).

Bad input and faults, in the OpenAI error shape (`{"error": {"message", "type", "param", "code"}}`):
a request the tenant rules refuse (`serving.gateway.tenants.Refused`: a key not in the key file 401,
the tenant header from an address that is not a trusted proxy 403, that header twice 400, a key
file that cannot be read 503), answered before its body is read and before anything goes upstream
(`/v1/models` too); a body over the limit 413; not JSON (NaN, Infinity, numbers out of range),
nested over `MAX_DEPTH`, not valid Unicode (a lone surrogate included), or not an object with its
prompt 400; every upstream
down 502, no first byte within `--timeout` 504, an error status passed on with its own status, past
the gateway's own slots (`app.gateway.slots`, per tenant and in all) 429 at once. A
stream whose upstream falls silent past `--idle-timeout` ends with an error event the client reads
(its status, 200, was sent long before). A plan that fails passes the request through
(`serving.gateway.forward`): the gateway answers no 5xx of its own. The body is parsed, and the
request planned, off the event loop when long. A client that goes away mid-stream closes the
upstream connection, which cancels the request there.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from app.gateway.slots import RETRY_AFTER_S, SLOTS
from app.services.gateway import current
from serving import ReplayError
from serving.gateway import CHAT, COMPLETIONS, Gateway, Prepared
from serving.gateway.tenants import Refused, Tenant
from serving.relay import Relay, UpstreamError
from vocabulary.text_rules import text_problem

HEADER = "x-kvnotes-gateway"
TENANT_HEADER = "x-kvnotes-tenant"  # how the request's tenant was told: user, header, key, shared, none
MAX_DEPTH = 64  # JSON nesting a request may have (OpenAI's shapes nest a dozen levels, tool schemas more)
PARSE_IN_THREAD = 256 << 10  # bytes of body above which it is parsed in a worker thread
router = APIRouter(tags=["gateway"])
metrics_router = APIRouter(tags=["gateway"])


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def openai_error(status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "invalid_request_error", 422: "invalid_request_error",
            429: "rate_limit_error", 503: "service_unavailable"}.get(status, "upstream_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


def _valid_text(body: object) -> None:
    """Refuse text the one set of text rules refuses (`vocabulary.text_rules`: not valid Unicode, such
    as a lone surrogate from a JSON escape, or a NUL; blank text is the client's own business), and
    nesting deeper than `MAX_DEPTH` (the body is encoded again to go upstream, and that encoder
    recurses per level). Walked with a stack, not recursion."""
    stack: list[tuple[object, str, int]] = [(body, "body", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value, blank=True)
            if problem:
                raise BadRequest(400, f"{where} {problem}", where)
            continue
        if isinstance(value, dict | list) and depth >= MAX_DEPTH:
            raise BadRequest(400, f"the request body nests arrays and objects over {MAX_DEPTH} levels "
                                  f"deep (at {where[:200]})", where[:200])
        if isinstance(value, dict):
            for key, item in reversed(value.items()):
                stack.append((item, f"{where}.{key}" if where != "body" else str(key), depth + 1))
                stack.append((key, where, depth + 1))
        elif isinstance(value, list):
            stack += [(item, f"{where}[{i}]", depth + 1) for i, item in reversed(list(enumerate(value)))]


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text[:40]} is out of range")
    return number


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _parse(data: bytes) -> dict:
    """The body as a JSON object; `BadRequest` (400) for anything else: not UTF-8, not JSON (NaN,
    Infinity and numbers out of a float's range included: nothing could send them on), nested deeper
    than `MAX_DEPTH`, not an object, text the text rules refuse."""
    try:
        body = json.loads(data, parse_float=_finite, parse_constant=_constant)
    except UnicodeDecodeError:
        raise BadRequest(400, "the request body is not valid UTF-8") from None
    except RecursionError:
        raise BadRequest(400, f"the request body is nested over {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise BadRequest(400, f"the request body is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    _valid_text(body)
    return body


async def _body(request: Request, limit: int, gateway: Gateway) -> dict:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"the request body is {int(declared)} bytes, over the gateway's limit "
                              f"of {limit}")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise BadRequest(413, f"the request body is over the gateway's limit of {limit} bytes")
    if len(data) > PARSE_IN_THREAD:  # a long body is read off the event loop too
        return await gateway.offload(_parse, bytes(data))
    return _parse(bytes(data))


def _tenant(request: Request) -> Tenant:
    """Whose bases a request may use (`serving.gateway.tenants`): the signed-in user under `serve`,
    else the key file's tenant of its key, or the trusted proxy's tenant header; `BadRequest` with
    the status when the request is refused."""
    principal = getattr(request.state, "principal", None)
    user = principal.name if principal is not None and principal.role != "share" else None
    client = request.client.host if request.client else None
    try:
        return current()[1].tenants.identify(user, request.headers, client)
    except Refused as exc:
        raise BadRequest(exc.status, str(exc)) from None


def _gateway() -> Gateway:
    gateway, setup = current()
    if gateway is None:
        raise BadRequest(503, f"the gateway is not set up: {setup.problem}")
    return gateway


class _Held(StreamingResponse):
    """A stream that gives its gateway slot back once it has been sent (or its client went away), and
    its upstream relay too: a client gone before the first chunk makes the first `send` fail, so the
    stream's generator never starts and its own `finally` never runs (`_Relayed.close` runs here)."""

    def __init__(self, relayed: _Relayed, *args, tenant: str, **kwargs) -> None:
        super().__init__(relayed.stream(), *args, **kwargs)
        self.relayed = relayed
        self.tenant = tenant

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.relayed.close()
            finally:
                SLOTS.give(self.tenant)


async def _forward(request: Request, route: str) -> Response:
    """One request, holding one of the gateway's own slots (`app.gateway.slots`) until its answer is
    sent: 429 at once past them."""
    from data.settings import get_settings

    try:
        gateway = _gateway()
        tenant = _tenant(request)  # before the body is read: a refused request costs nothing more
    except BadRequest as exc:
        return openai_error(exc.status, str(exc), exc.param, _www(exc.status))
    settings = get_settings()
    refused = SLOTS.take(tenant.id, settings.gateway_slots, settings.gateway_slots_per_user)
    if refused:
        return openai_error(429, refused, headers={"Retry-After": str(RETRY_AFTER_S),
                                                   TENANT_HEADER: tenant.header})
    response: Response | None = None
    try:
        response = await _answer(request, route, gateway, tenant, settings.gateway_max_body)
        return response
    finally:
        if not isinstance(response, _Held):
            SLOTS.give(tenant.id)


async def _answer(request: Request, route: str, gateway: Gateway, tenant: Tenant, limit: int) -> Response:
    try:
        body = await _body(request, limit, gateway)
        for name in ("messages",) if route == CHAT else ("prompt",):
            if name not in body:
                raise BadRequest(400, f"'{name}' is a required property", name)
    except BadRequest as exc:
        return openai_error(exc.status, str(exc), exc.param, _www(exc.status))
    prepared = await gateway.prepare(tenant, route, body)
    headers = {HEADER: prepared.plan.header, TENANT_HEADER: tenant.header}
    try:
        prepared, relay = await gateway.connect(prepared)
    except UpstreamError as exc:
        return openai_error(exc.status, str(exc), headers=headers)
    if relay.status != 200 or not relay.stream:
        try:
            data = await relay.read()
        except UpstreamError as exc:
            return openai_error(exc.status, str(exc), headers=headers)
        finally:
            await relay.aclose()
            gateway.release(prepared, relay)
        gateway.finish(prepared, relay)
        if relay.status != 200:
            return _upstream_error(relay.status, data, headers)
        return Response(data, status_code=200, media_type=relay.content_type, headers=headers)
    return _Held(_Relayed(gateway, prepared, relay), media_type="text/event-stream", headers=headers,
                 tenant=tenant.id)


def _upstream_error(status: int, data: bytes, headers: dict[str, str]) -> JSONResponse:
    """The upstream's error status, with its OpenAI-shaped message when it gave one."""
    try:
        message = json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        message = ""
    message = message if isinstance(message, str) else ""
    text = f"the serving engine answered HTTP {status}" + (f": {message[:500]}" if message else "")
    return openai_error(status, text, headers=headers)


class _Relayed:
    """One upstream stream passed on to its client (`stream`), closed once (`close`): the upstream
    relay closed and its upstream's in-flight count given back (`Gateway.release`)."""

    def __init__(self, gateway: Gateway, prepared: Prepared, relay: Relay) -> None:
        self.gateway, self.prepared, self.relay = gateway, prepared, relay
        self._closed = False

    async def stream(self) -> AsyncIterator[bytes]:
        """The upstream's events as they come; closing (the client gone: cancelled) closes the
        upstream. The request is counted before `data: [DONE]` is passed on: a client that closes once
        it has read it (the `openai` client does) cancels this generator before the upstream's stream
        ends."""
        gateway, prepared, relay = self.gateway, self.prepared, self.relay
        counted = False
        try:
            async for piece in relay.chunks():
                if relay.outcome.done and not counted:
                    counted = True
                    gateway.finish(prepared, relay)
                yield piece
            if not counted:
                gateway.finish(prepared, relay)
        except UpstreamError as exc:
            error = {"error": {"message": str(exc), "type": "upstream_error", "param": None,
                               "code": exc.status}}
            yield f"data: {json.dumps(error)}\n\n".encode()
        finally:
            await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.shield(self.relay.aclose())
        finally:
            self.gateway.release(self.prepared, self.relay)


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _forward(request, CHAT)


@router.post("/completions")
async def completions(request: Request) -> Response:
    return await _forward(request, COMPLETIONS)


def _www(status: int) -> dict[str, str] | None:
    return {"WWW-Authenticate": 'Bearer realm="kvnotes gateway"'} if status == 401 else None


@router.get("/models")
async def models(request: Request) -> Response:
    try:
        gateway = _gateway()
        _tenant(request)
        upstream = gateway.pool.least_loaded() or gateway.pool.upstreams[0]
        answer = await asyncio.to_thread(upstream.backend.models)
    except BadRequest as exc:
        return openai_error(exc.status, str(exc), headers=_www(exc.status))
    except ReplayError as exc:
        return openai_error(502, str(exc))
    return JSONResponse(answer, headers={HEADER: "pass-through; reason=models"})


@metrics_router.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    """prometheus_client's exposition of this process's own counters (`serving.gateway.stats`: no
    Redis is read; Prometheus sums them over processes and replicas), made in a worker thread."""
    gateway, _ = current()
    text = await asyncio.to_thread(gateway.stats.prometheus) if gateway is not None else b""
    return Response(text, media_type=CONTENT_TYPE_LATEST)
