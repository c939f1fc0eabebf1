"""The erratum gateway of this process, built once from the settings (`data.settings`, which
`kvnotes gateway`'s options set): the upstreams (`KVNOTES_GATEWAY_UPSTREAM`, comma-separated: each a
backend, a health check and a breaker, `serving.gateway.upstreams`), the router between them
(`KVNOTES_GATEWAY_ROUTE`, `_OVERLOAD`, and the replicas' KV events `_KV_EVENTS`), the template and
policy of the notebook named by `KVNOTES_GATEWAY_NOTEBOOK`, the tenant rules, the state, the rewriter.
The routes (`app.gateway.routes`) and the Gateway page (`app.web.gateway`) read the same one.

The state (`serving.gateway.state`): `KVNOTES_GATEWAY_STATE` (`--state`) when given; `memory` is this
process's memory (`kvnotes gateway` without `--state`); unset under `kvnotes serve`, the broker's
Redis when the broker is Redis (every web process then shares one state, under a key prefix of this
deployment's database, so two deployments on one Redis never meet), else this process's memory.

Tenants and secrets: the tenant rules (`serving.gateway.tenants`: `KVNOTES_GATEWAY_KEYS`, the tenant
header taken only from `KVNOTES_TRUSTED_PROXIES`), and the gateway's secret (`data.signing.secret_key`:
`KVNOTES_SECRET_KEY`, else the data folder's key file), from which each tenant's cache salt
(unless `KVNOTES_GATEWAY_CACHE_SALT=0`) and the key sealing the texts kept in Redis are derived
(`serving.gateway.sealing`).

The policy: `--policy` when given; else the notebook's adopted sweep policy (its threshold too);
else `erratum`. A strategy with no gateway layout (`recompute`, `prefix_reuse`, `in_place`, any
other) passes every request through, saying so.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from sqlalchemy import select

from data.db import get_sessionmaker
from data.models import Notebook
from data.settings import get_settings
from data.signing import SecretKeyProblem, secret_key
from serving import ReplayError, connect
from serving.gateway import LAYOUTS, PASS_THROUGH, Gateway, Rewriter, Settings, Slot, Template
from serving.gateway.redis_state import PREFIX, open_state
from serving.gateway.router import ROUTES, Router
from serving.gateway.sealing import GatewaySecret
from serving.gateway.stats import Stats
from serving.gateway.tenants import TenantRules
from serving.gateway.upstreams import HEALTH_TIMEOUT_S, Pool, Upstream

DEFAULT_THRESHOLD = 0.9
_made: dict[str, Gateway | GatewaySetup] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class GatewaySetup:
    """How this process's gateway was set up, for the page: the upstream, the layout and why, the
    template notebook (id and title) and its field labels, the threshold, the check rate."""

    upstream: str  # the upstreams, comma-separated
    layout: str
    policy_note: str
    notebook_id: int | None
    notebook_title: str
    labels: tuple[str, ...]
    threshold: float
    check_rate: float
    problem: str = ""
    tenants: TenantRules = TenantRules()
    state: str = "memory"
    route: str = "base"
    kv_events: bool = False
    cache_salt: bool = True  # each tenant's requests carry a cache salt of their own


def _policy(explicit: str, notebook: Notebook | None) -> tuple[str, str, float | None]:
    """(layout, why, threshold from the notebook or None)."""
    threshold = notebook.policy_threshold if notebook is not None else None
    if explicit:
        name, why = explicit, f"--policy {explicit}"
    elif notebook is not None and notebook.policy_strategy:
        name, why = notebook.policy_strategy, f"notebook {notebook.id}'s adopted sweep policy"
    else:
        name, why = LAYOUTS[0], "the default"
    if name in LAYOUTS:
        return name, f"{name} ({why})", threshold
    return PASS_THROUGH, f"policy {name} passes through ({why})", threshold


def _template(notebook: Notebook) -> Template:
    slots = [Slot(f.label or f"field {i + 1}", f.start, f.end) for i, f in enumerate(notebook.fields)]
    return Template(notebook.document, slots)


def build() -> tuple[Gateway, GatewaySetup]:
    """The gateway from the settings (a `ReplayError` naming what is wrong)."""
    settings = get_settings()
    upstream = settings.gateway_upstream or next(iter(settings.vllm_urls), "")
    urls = [u.strip() for u in upstream.split(",") if u.strip()]
    if not urls:
        raise ReplayError("no upstream: set KVNOTES_GATEWAY_UPSTREAM (or KVNOTES_VLLM_URL)", "upstream")
    endpoints = [e.strip() for e in settings.gateway_kv_events.split(",") if e.strip()]
    if endpoints and len(endpoints) != len(urls):
        raise ReplayError(f"KVNOTES_GATEWAY_KV_EVENTS names {len(endpoints)} endpoints for {len(urls)} "
                          "upstreams: give one per upstream, in the same order", "kv_events")
    if settings.gateway_route not in ROUTES:
        raise ReplayError(f"KVNOTES_GATEWAY_ROUTE must be one of {', '.join(ROUTES)}, not "
                          f"{settings.gateway_route!r}", "route")
    notebook = None
    if settings.gateway_notebook is not None:
        with get_sessionmaker()() as session:
            notebook = session.scalar(select(Notebook).where(Notebook.id == settings.gateway_notebook))
            if notebook is None:
                raise ReplayError(f"notebook {settings.gateway_notebook} does not exist", "notebook")
            template = _template(notebook)
            title, labels = notebook.title, template.labels
            layout, note, threshold = _policy(settings.gateway_policy, notebook)
    else:
        template, title, labels = None, "", ()
        layout, note, threshold = _policy(settings.gateway_policy, None)
    threshold = settings.gateway_threshold or threshold or DEFAULT_THRESHOLD
    rules = Settings(layout=layout, policy_reason=note if layout == PASS_THROUGH else "",
                     max_fields=settings.gateway_max_fields, check_rate=settings.gateway_check_rate,
                     threshold=threshold, seed=settings.gateway_seed)
    try:
        tenants = TenantRules.of(settings.gateway_tenant_header, settings.trusted_proxies,
                                 settings.gateway_keys, settings.gateway_rewrite_shared)
    except ValueError as exc:
        raise ReplayError(f"KVNOTES_TRUSTED_PROXIES: {exc}", "trusted_proxies") from None
    try:
        secret = GatewaySecret(secret_key())
    except SecretKeyProblem as exc:
        raise ReplayError(str(exc), "secret_key") from None
    pool = Pool([Upstream(connect(url, engine=settings.gateway_engine, timeout_s=settings.gateway_timeout_s),
                          connect(url, engine=settings.gateway_engine, timeout_s=HEALTH_TIMEOUT_S,
                                  connect_s=HEALTH_TIMEOUT_S)) for url in urls])
    events = None
    if endpoints:
        from serving.gateway.kv_events import KvEvents

        events = KvEvents({u.name: e for u, e in zip(pool.upstreams, endpoints)})
    state = open_state(state_url(settings), rules.limits, secret.sealer)
    router = Router(pool, state, settings.gateway_route, settings.gateway_overload, events)
    salt = secret.salt if settings.gateway_cache_salt else None
    gateway = Gateway(None, Rewriter(rules, template, Stats(state)), settings.gateway_timeout_s,
                      settings.gateway_keep_prompts, idle_s=settings.gateway_idle_timeout_s, pool=pool,
                      router=router, events=events, salt=salt)
    pool.start()
    if events is not None:
        events.start()
    setup = GatewaySetup(", ".join(u.name for u in pool.upstreams), layout, note, settings.gateway_notebook,
                         title, labels, threshold, settings.gateway_check_rate, tenants=tenants,
                         state=state.name, route=settings.gateway_route, kv_events=events is not None,
                         cache_salt=salt is not None and any(
                             getattr(u.backend, "takes_salt", False) for u in pool.upstreams))
    return gateway, setup


def state_url(settings) -> str:
    """The state's URL (see the module docstring): "" or "memory" for this process's memory."""
    if settings.gateway_state:
        return settings.gateway_state
    if settings.broker_url.startswith(("redis://", "rediss://")):
        deployment = hashlib.sha256(settings.database_url.encode()).hexdigest()[:8]
        return f"{settings.broker_url}#{PREFIX}{deployment}:"
    return ""


def current() -> tuple[Gateway | None, GatewaySetup]:
    """This process's gateway (built on first use) and its setup; None and the problem when it
    cannot be built (no upstream, a notebook that does not exist)."""
    with _lock:
        if "gateway" not in _made:
            try:
                _made["gateway"], _made["setup"] = build()
            except ReplayError as exc:
                return None, GatewaySetup("", "", "", None, "", (), 0.0, 0.0, problem=str(exc))
        return _made["gateway"], _made["setup"]  # type: ignore[return-value]


async def aclose() -> None:
    """Close this process's gateway, when it was built (the app's shutdown: its pools and state)."""
    with _lock:
        gateway = _made.pop("gateway", None)
        _made.pop("setup", None)
    if isinstance(gateway, Gateway):
        await gateway.aclose()


def reset() -> None:
    """Forget this process's gateway (tests; the next request builds it from the settings again)."""
    with _lock:
        _made.clear()
