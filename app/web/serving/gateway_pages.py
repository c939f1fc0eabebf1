"""The Gateway page: this web process's erratum gateway (`/gateway/v1`, `app.services.gateway`) and
its bases, live.

    GET /gateway          the page (how it is set up: upstream, layout and why, template notebook)
    GET /gateway/bases    the bases' table, which the page polls every 2 s (htmx)

The bases listed are the signed-in user's own (their tenant's: `serving.gateway.tenants`), viewers
too: a base's field labels are text from its prompts. Beside them, the totals of every tenant
(counts only). Per base: the fields seen, requests, rewrites and pass-throughs, the engine's hit
rate, TTFT p50/p90 of rewritten requests beside the passed-through ones, and the sampled agreement
with its interval; a base switched to pass-through says why. Per upstream (this process's counts):
in or out of rotation, its load, requests, prefill tokens sent and hit rate. Totals: requests, rewrites,
pass-throughs by reason, and what the sampled checks cost (the prompt tokens sent for checks beside
those sent for clients). Every web process reads the same state (`app.services.gateway`: the
broker's Redis, or `KVNOTES_GATEWAY_STATE`), so every process shows the same bases.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.services.gateway import current
from app.web.templating import render

router = APIRouter()


def _view(request: Request) -> dict:
    gateway, setup = current()
    if gateway is None:
        return {"setup": setup, "rows": [], "totals": None, "upstreams": []}
    principal = getattr(request.state, "principal", None)
    user = principal.name if principal is not None and principal.role != "share" else None
    tenant = setup.tenants.identify(user, {}).id if user else ""
    totals = gateway.stats.totals()
    try:
        rows = [] if totals.problem or not tenant else gateway.stats.rows(tenant=tenant)
    except gateway.stats.state.errors:  # gone since the totals were read: the totals say so next time
        rows = []
    return {"setup": setup, "rows": rows, "totals": totals, "upstreams": gateway.pool.rows()}


@router.get("/gateway")
def gateway_page(request: Request) -> Response:
    return render(request, "gateway.html", nav="gateway", **_view(request))


@router.get("/gateway/bases")
def gateway_bases(request: Request) -> Response:
    return render(request, "_gateway_bases.html", **_view(request))
