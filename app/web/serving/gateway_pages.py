"""The Gateway page: this web process's erratum gateway (`/gateway/v1`, `app.services.gateway`) and
its bases, live.

    GET /gateway          the page (how it is set up: upstream, layout and why, template notebook)
    GET /gateway/bases    the bases' table, which the page polls every 2 s (htmx)

Per base: the fields seen, requests, rewrites and pass-throughs, the engine's hit rate, TTFT p50/p90
of rewritten requests beside the passed-through ones, and the sampled agreement with its interval;
a base switched to pass-through says why. Each web process keeps its own bases (`--web-workers 1`
shows them all).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.services.gateway import current
from app.web.templating import render

router = APIRouter()


def _view() -> dict:
    gateway, setup = current()
    rows = sorted(gateway.stats.rows(), key=lambda r: -r.requests) if gateway is not None else []
    reasons = dict(gateway.stats.reasons) if gateway is not None else {}
    return {"setup": setup, "rows": rows, "reasons": reasons}


@router.get("/gateway")
def gateway_page(request: Request) -> Response:
    return render(request, "gateway.html", nav="gateway", **_view())


@router.get("/gateway/bases")
def gateway_bases(request: Request) -> Response:
    return render(request, "_gateway_bases.html", **_view())
