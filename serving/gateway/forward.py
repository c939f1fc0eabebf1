"""One request through the gateway: read, planned by the rewriter, sent to the one upstream through
the serving backend protocol (`Backend.relay`), counted; a sampled share also sent unchanged in the
background and compared (`agree`).

The web side (`app.gateway`) owns HTTP (bodies, limits, error shapes, streaming to the client);
this module owns what is sent and what is counted. A check runs only for a greedy request
(temperature 0): two samples of a sampled answer may differ without anything being wrong.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from serving.backend import Backend
from serving.gateway.prompts import read_prompt, with_context
from serving.gateway.rewrite import PLAN_FAILED, Plan, Rewriter
from serving.gateway.tenants import Tenant
from serving.relay import Relay, UpstreamError
from vocabulary.agreement import VALUE, agreement

log = logging.getLogger("kvnotes.gateway")
FIRST_WORDS = 8  # the first answer words two answers must share to agree
PLANNERS = 4  # worker threads that plan requests and parse long bodies (the GIL: more would not help)
PLANS_PER_TENANT = 2  # a tenant's requests planned at once in this process (one holds its lock, one
# waits); more pass through at once (`TENANT_BUSY`): one tenant's burst never takes every planner
CHECKS_AT_ONCE = 2  # checks sent upstream at once (each is a full prefill: it competes with clients)
CHECKS_WAITING = 16  # checks held at most (each holds its request's body); a check drawn past it is skipped
T = TypeVar("T")
_WORD = re.compile(r"\w+")


def agree(rewritten: str, unchanged: str, values: Sequence[str] = (), words: int = FIRST_WORDS) -> bool:
    """The check's verdict under the one rule (`vocabulary.agreement`): where the unchanged request's
    answer names one of the changed `values`, the rewritten one agrees when it names the same ones,
    whatever its wording; where it names none, their first `words` words (case folded, punctuation
    dropped) must be the same (no logits come back to compare first tokens)."""
    said = agreement(rewritten, unchanged, values=values)
    if said.basis == VALUE:
        return said.agrees
    return _WORD.findall(rewritten.casefold())[:words] == _WORD.findall(unchanged.casefold())[:words]


@dataclass(frozen=True)
class Prepared:
    """A request ready to send: the body as the client sent it, the body to send, and the plan."""

    route: str
    original: dict
    body: dict
    plan: Plan

    @property
    def rewritten(self) -> bool:
        return self.plan.context is not None


class Gateway:
    """The upstream (a `Backend`), the rewriter and the bounds."""

    def __init__(self, backend: Backend, rewriter: Rewriter, timeout_s: float = 120.0,
                 keep_prompts: bool = False, idle_s: float = 60.0) -> None:
        self.backend = backend
        self.rewriter = rewriter
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
            return Prepared(route, body, body, self.rewriter.busy())
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
        try:
            prompt, why_not = read_prompt(route, body)
            plan = self.rewriter.plan(client, prompt, why_not)
            rewrite = plan.context is not None and prompt is not None
            sent = with_context(body, prompt, plan.context) if rewrite else body
        except Exception:
            log.exception("gateway plan failed: the request passes through")
            return Prepared(route, body, body, Plan(None, PLAN_FAILED))
        if plan.context is not None:
            log.info("gateway rewrite", extra={"base": plan.base_id, "layout": plan.layout_name,
                                               "fields": ",".join(plan.labels)})
            if self.keep_prompts:
                log.info("gateway prompt", extra={"base": plan.base_id, "sent": str(sent)[:20000]})
        else:
            log.info("gateway pass-through", extra={"base": plan.base_id or "-", "reason": plan.reason})
        return Prepared(route, body, sent, plan)

    def open(self, prepared: Prepared) -> Relay:
        """The relay to enter (`async with`): the upstream's status, then the answer's bytes."""
        return self.backend.relay("/v1" + prepared.route, prepared.body, self.timeout_s, self.idle_s)

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
            async with self._check_slots, self.backend.relay("/v1" + prepared.route, body, self.timeout_s,
                                                             self.idle_s) as relay:
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
        close = getattr(self.backend, "aclose", None)
        if close is not None:
            await close()
        self._planner.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.stats.close)  # the last counts flushed, off the event loop
        self.rewriter.state.close()

    async def drain(self) -> None:
        """Wait for the checks in flight (tests, shutdown)."""
        while self._checks:
            await asyncio.gather(*list(self._checks), return_exceptions=True)
