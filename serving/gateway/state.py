"""Where the gateway keeps what it remembers: the bases of every tenant with their errata state, an
index of them, and the counts (per base, and the cluster's totals) that its statistics, switches and
Gateway page read. One interface, two implementations:

- `MemoryState` (`serving.gateway.memory_state`): this process's memory (`kvnotes gateway` without
  `--state`; one process).
- `RedisState` (`serving.gateway.redis_state`): one Redis (`--state redis://HOST:PORT/DB`, or
  `KVNOTES_GATEWAY_STATE`, or under `kvnotes serve` its broker's Redis), shared by every process and
  replica given it, so they send the upstream one base per tenant and prompt and judge agreement on
  every check.

**Threads, never the event loop.** Every method may block (a Redis round trip, a lock wait): call
them only from the gateway's planner threads (`Gateway.offload`) or from `Stats`' flusher thread. The
event loop only touches `Stats`' in-memory counters (`Stats.request`, `Stats.answered`), which the
flusher writes to the state in one pipeline every `FLUSH_S` (issue 49: a paused Redis must not
freeze a stream). `breaker` (`vocabulary.breaker.Breaker`) is the state's one circuit breaker: a
caller asks `breaker.allow()` first and reports `success()` / `failure()` (an exception of `errors`);
while it is open requests pass through (`STATE_DOWN`) and counts wait in memory.

**A plan** (`serving.gateway.rewrite.Rewriter.plan`) runs under its tenant's lock:
`with state.lock(tenant, wait_s) as lease:` (`LockBusy` when not acquired within `wait_s`: that one
request passes through, labelled `lock_busy`; it is not a fault of the state and trips no breaker;
memory locks time out too). Inside it: `index(tenant)` (cheap: one `BaseInfo` per live base, no
texts), then `load(tenant, ids)` of the candidates only (same model, API route and roles), then
`save(tenant, base, texts, lease)`, which is fenced: it is refused (False) when the lease was lost
(the lock expired and another process took it), so the last writer can never overwrite a newer
plan. A save applies the bounds in the same atomic step (one Lua script in Redis).

**The index** (`BaseInfo`): per base its id, model, API route (`route`: chat or completions), roles,
size in characters, last use, and `replica`: the upstream the router (issue 50) sent it to ("" none).
`set_replica(tenant, base_id, replica)` records it (no lock needed: one field of one entry);
`Base.replica` carries it through a plan, and `save` keeps it.

**Texts** cross the state's boundary in `Base.texts_json()` / `Base.loads()`; `RedisState` writes
and reads them only in `_seal` / `_unseal` (the place issue 48 encrypts them per tenant).

Bounds (`Limits`), the same in both: per tenant, `bases_per_tenant` bases and `chars_per_tenant`
characters held (the least recently used go first); overall, `tenants` tenants and `chars_total`
characters (the least recently used tenants go whole); a base unused for `ttl_s` is gone, its id
leaves `recent` at the next save of any tenant (no ghost bases). The bounds are applied at every
save, so a base that grows past them by new turns goes too. A base's counts and samples live and die
with it (`drop`). Sizes are set, not added, so a tenant dropped while one of its requests was planned
comes back consistent.

**Counts.** `add_many({key: {name: delta}})` adds to each key (a base's only while it lives) in one
step; `add` does one key and answers the new values (a check's verdict needs the cluster's numbers).
`TOTALS` is the cluster's totals (the page). `/metrics` does not read the state: it exports this
process's own counters (`Stats`), which Prometheus sums over processes and replicas.

Keys (Redis, under `prefix`): `b:{tenant}` (hash: base id → its texts, `{id}:s` → its errata state),
`i:{tenant}` (hash: base id → its index entry, JSON), `u:{tenant}` (zset: base id → last use),
`tenants` (zset: tenant → last use), `sizes` / `counts` (hash: tenant → characters / bases), `recent`
(zset: base id → last use), `c:{key}` (hash of counts), `l:{key}` (list of samples),
`lock:{tenant}`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from vocabulary.breaker import Breaker

TOTALS = "totals"  # the counts key of the totals (a base's is its id)
RETRY_S = 5.0  # after a fault the state is not asked again for this long (requests pass through)


class LockBusy(Exception):
    """A tenant's lock was not acquired within its wait: that request passes through (`lock_busy`);
    the state answered, so this is no fault of it."""


@dataclass(frozen=True)
class Lease:
    """A held tenant lock; `token` fences the saves made under it."""

    tenant: str
    token: str


@dataclass(frozen=True)
class Limits:
    """What the state may hold (see the module docstring)."""

    tenants: int = 256
    bases_per_tenant: int = 16
    chars_per_tenant: int = 4_500_000
    chars_total: int = 64_000_000
    ttl_s: float = 24 * 3600.0


@dataclass(frozen=True)
class BaseInfo:
    """One base's index entry: what a plan reads to pick its candidates, without the texts."""

    base_id: str
    model: str
    route: str
    roles: tuple[str, ...]
    size: int
    used: float = 0.0
    replica: str = ""

    def json(self) -> str:
        return json.dumps({"model": self.model, "route": self.route, "roles": list(self.roles),
                           "size": self.size, "replica": self.replica})

    @classmethod
    def loads(cls, base_id: str, entry: str, used: float) -> BaseInfo:
        e = json.loads(entry)
        return cls(base_id, e["model"], e["route"], tuple(e["roles"]), int(e["size"]), used,
                   e.get("replica", ""))

    def fits(self, model: str, route: str, roles: tuple[str, ...] | list[str]) -> bool:
        """Whether a prompt of this model, route and roles may match the base (its roles a prefix of
        the prompt's, or the prompt's of its)."""
        n = min(len(self.roles), len(roles))
        return self.model == model and self.route == route and tuple(self.roles[:n]) == tuple(roles[:n])


@dataclass
class Base:
    """One remembered prompt of one tenant (`serving.gateway.rewrite` reads and writes it)."""

    base_id: str
    model: str
    route: str
    roles: list[str]
    texts: list[str]
    errata: dict[int, str] = field(default_factory=dict)
    told: dict[tuple[int, int, int], str] = field(default_factory=dict)
    labels: dict[tuple[int, int, int], str] = field(default_factory=dict)
    # the errata of the latest request's turn: (message, text, values told); kept once a later turn
    # arrives, replaced while the same turn is asked again with other values
    pending: tuple[int, str, dict[tuple[int, int, int], str]] | None = None
    moved: dict[int, dict[tuple[int, int], str]] = field(default_factory=dict)
    replica: str = ""  # the upstream the router sent it to (issue 50), kept in the index

    @property
    def size(self) -> int:
        """The characters it holds (texts and errata)."""
        return sum(map(len, self.texts)) + sum(map(len, self.errata.values()))

    def info(self, used: float = 0.0) -> BaseInfo:
        return BaseInfo(self.base_id, self.model, self.route, tuple(self.roles), self.size, used,
                        self.replica)

    def texts_json(self) -> str:
        return json.dumps({"model": self.model, "route": self.route, "roles": self.roles,
                           "texts": self.texts})

    def state_json(self) -> str:
        pending = self.pending and [self.pending[0], self.pending[1], _items(self.pending[2])]
        return json.dumps({"errata": {str(k): v for k, v in self.errata.items()}, "told": _items(self.told),
                           "labels": _items(self.labels), "pending": pending,
                           "moved": {str(k): [[a, b] for a, b in v] for k, v in self.moved.items()}})

    @classmethod
    def loads(cls, base_id: str, texts: str, state: str | None, replica: str = "") -> Base:
        t = json.loads(texts)
        s = json.loads(state) if state else {}
        pending = s.get("pending")
        return cls(base_id, t["model"], t["route"], t["roles"], t["texts"],
                   {int(k): v for k, v in s.get("errata", {}).items()}, _dict(s.get("told", [])),
                   _dict(s.get("labels", [])),
                   None if pending is None else (pending[0], pending[1], _dict(pending[2])),
                   {int(k): {(a, b): "" for a, b in v} for k, v in s.get("moved", {}).items()}, replica)


def _items(mapping: dict[tuple[int, int, int], str]) -> list:
    return [[*key, value] for key, value in mapping.items()]


def _dict(items: list) -> dict[tuple[int, int, int], str]:
    return {(a, b, c): value for a, b, c, value in items}


class State:
    """The interface (see the module docstring); `errors`: the exceptions that mean the state could
    not be reached (the request then passes through, and `breaker` opens)."""

    name = "memory"
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.breaker = Breaker("gateway state", RETRY_S)

    @property
    def down(self) -> bool:
        return self.breaker.down

    # --- bases (a plan, under the tenant's `lock`) -----------------------------------------------------
    def lock(self, tenant: str, wait_s: float):  # a context manager yielding a `Lease`; `LockBusy`
        raise NotImplementedError

    def index(self, tenant: str) -> list[BaseInfo]:
        """The tenant's live bases (those past `ttl_s` left out), least recently used first."""
        raise NotImplementedError

    def load(self, tenant: str, base_ids: list[str]) -> list[Base]:
        """Those of `base_ids` the tenant still holds, whole, in the order asked."""
        raise NotImplementedError

    def bases(self, tenant: str) -> list[Base]:
        """Every live base of the tenant, whole (tests, tools: a plan loads only its candidates)."""
        return self.load(tenant, [info.base_id for info in self.index(tenant)])

    def save(self, tenant: str, base: Base, texts: bool, lease: Lease | None = None) -> bool:
        """Keep `base` (its texts too when `texts`) as the tenant's most recent, then apply the bounds,
        in one step; False (nothing written) when `lease` is no longer held."""
        raise NotImplementedError

    def drop(self, tenant: str, base_id: str) -> None:
        raise NotImplementedError

    def set_replica(self, tenant: str, base_id: str, replica: str) -> None:
        """Record the upstream a base was sent to (the router's table, issue 50)."""
        raise NotImplementedError

    # --- counts --------------------------------------------------------------------------------------
    def add(self, key: str, counts: dict[str, float]) -> dict[str, float]:
        """Add `counts` to `key`'s (a base's only while it lives); the new values ({} when dead)."""
        raise NotImplementedError

    def add_many(self, counts: dict[str, dict[str, float]], samples: dict[str, list[float]],
                 keep: int) -> None:
        """Add many keys' counts and push their samples (each list kept to its `keep` latest), in
        one round trip (`Stats`' flusher)."""
        raise NotImplementedError

    def put(self, key: str, name: str, value: str, only_new: bool = False) -> str:
        """Set one text of `key` (kept when `only_new` and it has one); the value now."""
        raise NotImplementedError

    def read(self, *keys: str) -> list[dict[str, str]]:
        raise NotImplementedError

    def push(self, key: str, value: float, keep: int) -> None:
        self.add_many({}, {key: [value]}, keep)

    def samples(self, key: str) -> list[float]:
        raise NotImplementedError

    def recent(self, n: int) -> list[str]:
        """The ids of the `n` most recently used live bases, of every tenant."""
        raise NotImplementedError

    def sizes(self) -> tuple[int, int]:
        """(tenants, bases) held."""
        raise NotImplementedError

    def close(self) -> None:
        pass



def new_token() -> str:
    return uuid.uuid4().hex
