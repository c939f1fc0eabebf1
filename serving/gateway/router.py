"""Which upstream a request goes to (`--route`, default `base`): where its base's prefix is cached.

- `base`: a base's first request goes to the least-loaded upstream (`serving.gateway.upstreams`:
  ties round-robin), which is recorded with the base in the gateway's state (the `replica` of its
  index entry, `State.set_replica`: this process's memory, or the Redis every gateway process
  shares, so every process routes a base alike). Its later requests, errata included, go to the upstream
  recorded, unless it is out of rotation or its load exceeds the least-loaded upstream's by more
  than `overload` requests: then to the least loaded, which is recorded in its place. A request
  with no base (no tenant, a short context) goes to the least loaded. A base is one tenant's
  (`serving.gateway.tenants`), so routing never mixes tenants: it chooses where a request goes, never
  what it carries.
- With KV events (`--kv-events`, `serving.gateway.kv_events`): the record is checked against what
  the replicas say they hold. The base's tokens (the engine's tokenizer, once per base and process)
  are hashed per block as the events are; the upstream holding the longest run of its leading
  blocks (at least half of them) is preferred, the recorded one on a tie. A base no replica holds
  (evicted, or its replica restarted: AllBlocksCleared or a gap in its event sequence) is routed
  afresh to the least loaded instead of trusted to the record.
- `least-loaded` and `round-robin` ignore bases (the benchmark's arms).

The overload bound (`OVERLOAD`, `--overload`): moving a base costs one full prefill on the replica
that takes it; staying costs the queue ahead of it. On this machine's vLLM CPU build a 1.2k-token
miss took 5.2 s against 0.3 s for a hit (docs/gateway.md, Measured), so waiting behind up to ~16
requests is still cheaper than prefilling the base again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from serving.gateway.state import State
from serving.gateway.upstreams import Pool, Upstream
from serving.server import ReplayError

log = logging.getLogger("kvnotes.gateway")
ROUTES = ("base", "least-loaded", "round-robin")
OVERLOAD = 16  # requests of load above the least-loaded upstream's past which a base moves
TOKENS_KEPT = 1024  # bases whose token ids this process keeps (KV events only)


@dataclass(frozen=True)
class Choice:
    """Where a request goes, and why (a closed set: the `why` label of kvnotes_gateway_routes_total)."""

    upstream: Upstream
    why: str


class Router:
    """The choice of `mode` over `pool`, with the record in `state` (see the module docstring)."""

    def __init__(self, pool: Pool, state: State, mode: str = "base", overload: float = OVERLOAD,
                 events=None) -> None:
        if mode not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, not {mode!r}")
        self.pool, self.state, self.mode, self.overload, self.events = pool, state, mode, overload, events
        self.choices: Counter[str] = Counter()  # this process's choices by why
        self.salt: Callable[[str], str] | None = None  # tenant -> the cache salt its requests carry
        self._tokens: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def choose(self, tenant: str, base_id: str | None, body: dict) -> Choice:
        """Where `body` (the request as it will be sent) of the tenant's base `base_id` goes: on a
        planner thread, since it may ask the state (Redis) and, with events, the engine's tokenizer."""
        choice = self._choose(tenant, base_id, body)
        with self._lock:
            self.choices[choice.why] += 1
        return choice

    def _choose(self, tenant: str, base_id: str | None, body: dict) -> Choice:
        if len(self.pool) == 1:
            return Choice(self.pool.upstreams[0], "only")
        if self.mode == "round-robin":
            return Choice(self.pool.round_robin(), "round_robin")
        breaker = self.state.breaker
        if self.mode == "least-loaded" or not tenant or base_id is None or not breaker.allow():
            return Choice(self._least(), "least_loaded")
        try:
            choice = _Record(self.state, tenant, base_id)
            choice = self._by_base(choice, body)
        except self.state.errors as exc:
            breaker.failure()
            log.warning("gateway state unreachable: routed to the least loaded",
                        extra={"state": self.state.name, "error": str(exc)[:200]})
            return Choice(self._least(), "least_loaded")
        breaker.success()
        return choice

    def _least(self, exclude: tuple[Upstream, ...] = ()) -> Upstream:
        return self.pool.least_loaded(exclude) or self.pool.upstreams[0]

    def _by_base(self, record: _Record, body: dict) -> Choice:
        recorded = self.pool.named(record.read())
        target, why = recorded, "recorded"
        if self.events is not None:
            held = self._held(record.tenant, record.base_id, body)
            if held is not None and recorded not in held:
                target, why = (self._fittest(held), "events") if held else (None, "evicted")
        if target is None:
            chosen = self._least()
            record.write(chosen.name)
            return Choice(chosen, "first" if recorded is None else why)
        unfit = self._unfit(target)
        if unfit:
            chosen = self._least(exclude=(target,))
            record.write(chosen.name)
            return Choice(chosen, unfit)
        if target is not recorded:
            record.write(target.name)
        return Choice(target, why)

    def _unfit(self, upstream: Upstream) -> str:
        """Why `upstream` should not take the base's request now ("" when it should)."""
        if not upstream.in_rotation and any(u.in_rotation for u in self.pool.upstreams):
            return "out"
        low = min(u.load for u in self.pool.in_rotation())
        return "overloaded" if upstream.load - low > self.overload else ""

    def _fittest(self, holders: list[Upstream]) -> Upstream:
        return min(holders, key=lambda u: u.load)

    def moved(self, tenant: str, base_id: str | None, upstream: Upstream) -> None:
        """Record that the base's request went to `upstream` instead (its choice could not be
        reached); a state that fails is logged, never the request's failure."""
        breaker = self.state.breaker
        if not tenant or base_id is None or self.mode != "base" or not breaker.allow():
            return
        try:
            self.state.set_replica(tenant, base_id, upstream.name)
        except self.state.errors as exc:
            breaker.failure()
            log.warning("gateway state unreachable: a route is not recorded", extra={"error": str(exc)[:200]})
            return
        breaker.success()

    # --- KV events ---------------------------------------------------------------------------------------

    def _held(self, tenant: str, base_id: str, body: dict) -> list[Upstream] | None:
        """The upstreams in rotation that hold the longest run of the base's leading blocks (at least
        half of them); [] when none does; None when the events cannot tell (no block size yet, or the
        base's tokens could not be counted)."""
        size = self.events.block_size
        tokens = self._base_tokens(base_id, body) if size else None
        if not tokens or len(tokens) < size:
            return None
        chain = self.events.chain(tokens, self.salt(tenant) if self.salt is not None else "")
        runs = {u: self.events.held(u.name, chain) for u in self.pool.in_rotation()}
        best = max(runs.values(), default=0)
        if best == 0 or 2 * best < len(chain):
            return []
        return [u for u, n in runs.items() if n == best]

    def _base_tokens(self, base_id: str, body: dict) -> list[int] | None:
        with self._lock:
            if base_id in self._tokens:
                self._tokens.move_to_end(base_id)
                return self._tokens[base_id]
        try:
            tokens = self._least().probe.tokenize(body)
        except ReplayError as exc:
            log.warning("gateway could not count a base's tokens: routed by the record",
                        extra={"base": base_id, "error": str(exc)[:200]})
            return None
        with self._lock:
            self._tokens[base_id] = tokens
            while len(self._tokens) > TOKENS_KEPT:
                self._tokens.popitem(last=False)
        return tokens


class _Record:
    """The upstream recorded with one base: the `replica` of its entry in the state's index."""

    def __init__(self, state: State, tenant: str, base_id: str) -> None:
        self.state, self.tenant, self.base_id = state, tenant, base_id

    def read(self) -> str | None:
        entry = next((i for i in self.state.index(self.tenant) if i.base_id == self.base_id), None)
        return entry.replica if entry is not None and entry.replica else None

    def write(self, upstream: str) -> None:
        self.state.set_replica(self.tenant, self.base_id, upstream)
