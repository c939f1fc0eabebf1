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
from dataclasses import dataclass

from serving.backend import Backend
from serving.gateway.prompts import read_prompt, with_context
from serving.gateway.rewrite import Plan, Rewriter
from serving.relay import Relay, UpstreamError

log = logging.getLogger("kvnotes.gateway")
FIRST_WORDS = 8  # the first answer words two answers must share to agree
_WORD = re.compile(r"\w+")


def agree(rewritten: str, unchanged: str, words: int = FIRST_WORDS) -> bool:
    """Two answers agree when their first `words` words (case folded, punctuation dropped) are the
    same: the same choice, or the same first answer tokens."""
    a = _WORD.findall(rewritten.casefold())[:words]
    b = _WORD.findall(unchanged.casefold())[:words]
    return a == b


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
                 keep_prompts: bool = False) -> None:
        self.backend = backend
        self.rewriter = rewriter
        self.timeout_s = timeout_s
        self.keep_prompts = keep_prompts
        self._checks: set[asyncio.Task] = set()

    @property
    def stats(self):
        return self.rewriter.stats

    def prepare(self, client: str, route: str, body: dict) -> Prepared:
        prompt, why_not = read_prompt(route, body)
        plan = self.rewriter.plan(client, prompt, why_not)
        sent = body if plan.context is None or prompt is None else with_context(body, prompt, plan.context)
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
        return self.backend.relay("/v1" + prepared.route, prepared.body, self.timeout_s)

    def finish(self, prepared: Prepared, relay: Relay) -> None:
        """Count the answered request, and start its check when it was drawn for one."""
        if relay.status != 200:
            return
        out = relay.outcome
        self.stats.answered(prepared.plan.base_id, prepared.rewritten, out.ttft_ms if relay.stream else None,
                            out.prompt_tokens, out.cached_tokens)
        greedy = prepared.original.get("temperature") in (0, 0.0)
        if prepared.plan.check and prepared.plan.base_id and greedy:
            task = asyncio.get_running_loop().create_task(self._check(prepared, out.text))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _check(self, prepared: Prepared, rewritten_text: str) -> None:
        body = {**prepared.original, "stream": False}
        body.pop("stream_options", None)
        try:
            async with self.backend.relay("/v1" + prepared.route, body, self.timeout_s) as relay:
                await relay.read()
                if relay.status != 200:
                    return
                agreed = agree(rewritten_text, relay.outcome.text)
        except UpstreamError:
            return
        switched = self.rewriter.checked(prepared.plan.base_id or "", agreed)
        log.info("gateway check", extra={"base": prepared.plan.base_id, "agreed": agreed,
                                         "pass_through": bool(switched)})
        if switched and not agreed:
            log.warning("gateway base switched to pass-through",
                        extra={"base": prepared.plan.base_id, "reason": switched})

    async def drain(self) -> None:
        """Wait for the checks in flight (tests, shutdown)."""
        while self._checks:
            await asyncio.gather(*list(self._checks), return_exceptions=True)
