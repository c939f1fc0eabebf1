"""One request through the gateway: read, planned by the rewriter, routed to one of the upstreams
(`serving.gateway.router`), sent through the serving backend protocol (`Backend.relay`: `_relay` is
the one place an upstream request is built, clients' and checks' alike), counted; a sampled share
also sent unchanged in the background and compared (`agree`). An upstream that cannot be reached
(or answers 503) is taken out of rotation and the request goes to the next least loaded one
(`connect`), never a 5xx while another is in rotation.

The web side (`app.gateway`) owns HTTP (bodies, limits, error shapes, streaming to the client);
this module owns what is sent and what is counted. A check runs only for a greedy request
(temperature 0): two samples of a sampled answer may differ without anything being wrong.

Every upstream request carries its tenant's `cache_salt` (`_relay`, `salted`;
`serving.gateway.sealing`) when the upstream's engine takes one (`Backend.takes_salt`) and the
operator has not turned salting off: the engine's prefix cache then answers a tenant only from
that tenant's own requests. A request with no tenant carries the salt of no tenant (all such
requests share one), and a client's own `cache_salt` is replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from serving.backend import Backend
from serving.gateway.prompts import read_prompt, with_context
from serving.gateway.rewrite import PLAN_FAILED, Plan, Rewriter
from serving.gateway.router import Choice, Router
from serving.gateway.tenants import Tenant
from serving.gateway.upstreams import Pool, Upstream
from serving.relay import Relay, UpstreamError
from vocabulary.agreement import agreement

log = logging.getLogger("kvnotes.gateway")
PLANNERS = 4  # worker threads that plan requests and parse long bodies (the GIL: more would not help)
PLANS_PER_TENANT = 2  # a tenant's requests planned at once in this process (one holds its lock, one
# waits); more pass through at once (`TENANT_BUSY`): one tenant's burst never takes every planner
CHECKS_AT_ONCE = 2  # checks sent upstream at once (each is a full prefill: it competes with clients)
CHECKS_WAITING = 16  # checks held at most (each holds its request's body); a check drawn past it is skipped
T = TypeVar("T")


def agree(rewritten: str, unchanged: str, values: Sequence[str] = ()) -> bool:
    """The check's verdict under the one rule (`vocabulary.agreement`), with the changed `values`
    (each change's old and new text, never a quoted line): where the unchanged request's answer names
    one of them, the rewritten one agrees when it names the same ones, whatever its wording; where it
    names none, the rule's own fallback (no logits come back to compare first tokens: the same
    normalised words)."""
    return agreement(rewritten, unchanged, values=values).agrees


def salted(body: dict, salt: str) -> dict:
    """`body` as sent upstream: with `cache_salt` set to `salt` (the client's own replaced); unchanged
    when `salt` is "" (salting off)."""
    return {**body, "cache_salt": salt} if salt else body


@dataclass(frozen=True)
class Prepared:
    """A request ready to send: the body as the client sent it, the body to send, and the plan."""

    route: str
    original: dict
    body: dict
    plan: Plan
    upstream: Upstream | None = None  # where it goes (`Router.choose`)
    tenant: str = ""  # whose request it is (its tenant's id; "" for none)

    @property
    def rewritten(self) -> bool:
        return self.plan.context is not None


class Gateway:
    """The upstreams (`pool`, or the one `backend`), the router, the rewriter and the bounds."""

    def __init__(self, backend: Backend | None, rewriter: Rewriter, timeout_s: float = 120.0,
                 keep_prompts: bool = False, idle_s: float = 60.0, pool: Pool | None = None,
                 router: Router | None = None, events=None,
                 salt: Callable[[str], str] | None = None) -> None:
        if pool is None:
            if backend is None:
                raise ValueError("the gateway needs an upstream")
            pool = Pool([Upstream(backend, backend)])
        self.pool = pool
        self.backend = backend or pool.upstreams[0].backend  # /v1/models asks the first
        self.router = router or Router(pool, rewriter.state)
        self.events = events
        self.rewriter = rewriter
        self.salt = salt  # tenant id -> its cache salt (`GatewaySecret.salt`); None: salting off
        if salt is not None and any(getattr(u.backend, "takes_salt", False) for u in pool.upstreams):
            self.router.salt = salt  # the KV events' blocks of a tenant are keyed by its salt too
        rewriter.stats.registry.register(_Routing(self))
        self.timeout_s = timeout_s  # to the upstream's first byte
        self.idle_s = idle_s  # between one piece of its answer and the next
        self.keep_prompts = keep_prompts
        self._checks: set[asyncio.Task] = set()
        self._check_slots = asyncio.Semaphore(CHECKS_AT_ONCE)
        self._planning: Counter[str] = Counter()  # tenant -> its requests in planning (event loop only)
        self._planner = ThreadPoolExecutor(max_workers=PLANNERS, thread_name_prefix="gateway-plan")

    @property
    def stats(self):
        return self.rewriter.stats

    async def offload(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` on the gateway's own worker threads (`PLANNERS` of them): a long prompt's
        diff or body never holds the event loop, and a burst of them never takes every thread of
        the loop's default pool, which `/v1/models` and the pages use."""
        return await asyncio.get_running_loop().run_in_executor(self._planner, partial(work, *args))

    @property
    def checks_skipped(self) -> int:
        """Checks drawn while `CHECKS_WAITING` were held (this process's)."""
        return int(self.stats.local["checks_skipped"])

    async def prepare(self, client: Tenant | str, route: str, body: dict) -> Prepared:
        """`plan`, off the event loop (`offload`); a request of a tenant that has `PLANS_PER_TENANT`
        in planning already passes through at once (the Redis lock serializes a tenant's plans: the
        others would only wait, holding planner threads every other tenant needs)."""
        tenant = client if isinstance(client, str) else client.id
        if tenant and self._planning[tenant] >= PLANS_PER_TENANT:
            log.info("gateway tenant busy: the request passes through")
            return Prepared(route, body, body, self.rewriter.busy(), tenant=tenant)
        self._planning[tenant] += 1
        try:
            return await self.offload(self.plan, client, route, body)
        finally:
            self._planning[tenant] -= 1
            if self._planning[tenant] <= 0:
                del self._planning[tenant]

    def plan(self, client: Tenant | str, route: str, body: dict) -> Prepared:
        """What to send for `body`. A plan that fails passes the request through as it came, logged
        (the rewriter has dropped the base when the failure was in one): never a 5xx of its own."""
        tenant = client.id if isinstance(client, Tenant) else client
        try:
            prompt, why_not = read_prompt(route, body)
            plan = self.rewriter.plan(client, prompt, why_not)
            rewrite = plan.context is not None and prompt is not None
            sent = with_context(body, prompt, plan.context) if rewrite else body
        except Exception:
            log.exception("gateway plan failed: the request passes through")
            upstream = self._route(tenant, None, body).upstream
            return Prepared(route, body, body, Plan(None, PLAN_FAILED), upstream, tenant)
        choice = self._route(tenant, plan.base_id, sent)
        if plan.context is not None:
            # the fields' labels are text from the prompt: counted here, named only with --keep-prompts
            log.info("gateway rewrite", extra={"base": plan.base_id, "layout": plan.layout_name,
                                               "fields": len(plan.labels)})
            if self.keep_prompts:
                log.info("gateway prompt", extra={"base": plan.base_id, "fields": ",".join(plan.labels),
                                                  "sent": str(sent)[:20000]})
        else:
            log.info("gateway pass-through", extra={"base": plan.base_id or "-", "reason": plan.reason})
        return Prepared(route, body, sent, plan, choice.upstream, tenant)

    def _route(self, tenant: str, base_id: str | None, body: dict) -> Choice:
        try:
            return self.router.choose(tenant, base_id, body)
        except Exception:  # a bug in routing: the first upstream in rotation, never a 5xx
            log.exception("gateway routing failed: the least-loaded upstream takes the request")
            return Choice(self.pool.least_loaded() or self.pool.upstreams[0], "least_loaded")

    def _relay(self, upstream: Upstream | None, route: str, body: dict, tenant: str) -> Relay:
        """The one place an upstream request is built (clients' and checks' alike), with `tenant`'s
        cache salt when salting is on and the upstream's engine takes one."""
        upstream = upstream or self.pool.upstreams[0]
        if self.salt is not None and getattr(upstream.backend, "takes_salt", False):
            body = salted(body, self.salt(tenant))
        return upstream.backend.relay("/v1" + route, body, self.timeout_s, self.idle_s)

    def open(self, prepared: Prepared) -> Relay:
        """The relay to enter (`async with`): the upstream's status, then the answer's bytes."""
        return self._relay(prepared.upstream, prepared.route, prepared.body, prepared.tenant)

    async def connect(self, prepared: Prepared) -> tuple[Prepared, Relay]:
        """`open` entered, on the upstream chosen, or, when it cannot be reached (or answers 503),
        on the next least loaded one in rotation: that upstream is taken out of rotation (its
        breaker opens) and recorded with the base. `UpstreamError` when none answers; `release`
        must follow a relay returned."""
        tried: list[Upstream] = []
        if prepared.upstream is None:  # not planned (a busy tenant's request): the least loaded
            prepared = replace(prepared, upstream=self.pool.least_loaded() or self.pool.upstreams[0])
        while True:
            upstream = prepared.upstream or self.pool.upstreams[0]
            relay = self.open(prepared)
            upstream.started()
            try:
                await relay.__aenter__()
            except UpstreamError as exc:
                upstream.ended()
                after = self._next(upstream, tried) if exc.status == 502 else None
                if after is None:
                    raise
            else:
                if relay.status != 503:
                    upstream.breaker.success()  # it answered: in rotation (one upstream has no health thread)
                    return prepared, relay
                if (after := self._next(upstream, tried)) is None:
                    return prepared, relay
                await relay.aclose()
                upstream.ended()
            log.warning("gateway upstream failed: the request goes to another",
                        extra={"upstream": upstream.name, "to": after.name,
                               "base": prepared.plan.base_id or "-"})
            prepared = replace(prepared, upstream=after)
            await self.offload(self.router.moved, prepared.tenant, prepared.plan.base_id, after)

    def _next(self, failed: Upstream, tried: list[Upstream]) -> Upstream | None:
        """`failed` out of rotation; the least loaded upstream in rotation not yet tried, or None."""
        failed.breaker.failure()
        tried.append(failed)
        after = self.pool.least_loaded(exclude=tried)
        return after if after is not None and after.in_rotation else None

    def release(self, prepared: Prepared, relay: Relay) -> None:
        """The request is over (answered or not): its upstream's in-flight count and counts."""
        upstream = prepared.upstream or self.pool.upstreams[0]
        out = relay.outcome
        upstream.ended(out.prompt_tokens, out.cached_tokens, answered=relay.status == 200)

    def finish(self, prepared: Prepared, relay: Relay) -> None:
        """Count the answered request (in memory: `Stats.answered` never waits on the state), and
        start its check when it was drawn for one (a failure here is logged: the client's answer is on
        its way and must not fail with it)."""
        if relay.status != 200:
            return
        try:
            self._finish(prepared, relay)
        except Exception:
            log.exception("gateway count failed", extra={"base": prepared.plan.base_id or "-"})

    def _finish(self, prepared: Prepared, relay: Relay) -> None:
        out = relay.outcome
        self.stats.answered(prepared.plan.base_id, prepared.rewritten, out.ttft_ms if relay.stream else None,
                            out.prompt_tokens, out.cached_tokens)
        greedy = prepared.original.get("temperature") in (0, 0.0)
        if prepared.plan.check and prepared.plan.base_id and greedy:
            if len(self._checks) >= CHECKS_WAITING:
                self.stats.count_local("checks_skipped")
                return
            task = asyncio.get_running_loop().create_task(self._check(prepared, out.text))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _check(self, prepared: Prepared, rewritten_text: str) -> None:
        body = {**prepared.original, "stream": False}
        body.pop("stream_options", None)
        try:
            async with self._check_slots, self._relay(prepared.upstream, prepared.route, body,
                                                      prepared.tenant) as relay:
                await relay.read()
                if relay.status != 200:
                    return
                agreed = agree(rewritten_text, relay.outcome.text, prepared.plan.values)
                tokens = relay.outcome.prompt_tokens
        except UpstreamError:
            return
        # counted in the state (Redis, perhaps) off the event loop
        switched = await self.offload(self.rewriter.checked, prepared.plan.base_id or "", agreed, tokens)
        log.info("gateway check", extra={"base": prepared.plan.base_id, "agreed": agreed,
                                         "pass_through": bool(switched)})
        if switched and not agreed:
            log.warning("gateway base switched to pass-through",
                        extra={"base": prepared.plan.base_id, "reason": switched})

    async def aclose(self) -> None:
        """Shut down: the checks in flight cancelled, the upstream's connection pools closed, the
        planner threads stopped, the state's connections closed."""
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*list(self._checks), return_exceptions=True)
        for upstream in self.pool.upstreams:
            close = getattr(upstream.backend, "aclose", None)
            if close is not None:
                await close()
        self.pool.close()
        if self.events is not None:
            self.events.close()
        self._planner.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.stats.close)  # the last counts flushed, off the event loop
        self.rewriter.state.close()

    async def drain(self) -> None:
        """Wait for the checks in flight (tests, shutdown)."""
        while self._checks:
            await asyncio.gather(*list(self._checks), return_exceptions=True)


class _Routing:
    """The upstreams', the routes' and the KV events' families for /metrics (this process's)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        yield from self.gateway.pool.collect()
        routes = CounterMetricFamily("kvnotes_gateway_routes", "This process's routing choices, by why: "
                                     "first (a new base), recorded, events, evicted, out, overloaded, "
                                     "least_loaded, round_robin, only.", labels=["why"])
        for why, n in sorted(self.gateway.router.choices.items()):
            routes.add_metric([why], n)
        yield routes
        if self.gateway.events is not None:
            yield from self.gateway.events.collect()
