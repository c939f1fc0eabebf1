"""Where the gateway keeps what it remembers: the bases of every tenant with their errata state, and
the counts (per base and in total) that its statistics, switches and `/metrics` read. One interface,
two implementations:

- `MemoryState`: this process's memory (`kvnotes gateway` without `--state`; one process).
- `RedisState`: one Redis (`--state redis://HOST:PORT/DB`, or `KVNOTES_GATEWAY_STATE`, or under
  `kvnotes serve` its broker's Redis), shared by every process and replica given it, so they send
  the upstream one base per tenant and prompt, judge agreement on every check, and count exactly.
  A tenant's plan runs under its lock there (`lock`), so two processes never both start a base.

Bounds (`Limits`), the same in both: per tenant, `bases_per_tenant` bases and `chars_per_tenant`
characters held (the least recently used go first); overall, `tenants` tenants and `chars_total`
characters (the least recently used tenants go whole); a base unused for `ttl_s` is gone. The bounds
are applied at every save, so a base that grows past them by new turns goes too. A base's
counts and samples live and die with it (`drop`). Sizes are set, not added, so a tenant dropped
while one of its requests was planned comes back consistent.

Keys (Redis, under `prefix`): `b:{tenant}` (hash: base id → its texts, `{id}:s` → its errata state),
`u:{tenant}` (zset: base id → last use), `tenants` (zset: tenant → last use), `sizes` / `counts`
(hash: tenant → characters / bases), `recent` (zset: base id → last use), `c:{key}` (hash of counts),
`l:{key}` (list of samples), `lock:{tenant}`.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TOTALS = "totals"  # the counts key of the totals (a base's is its id)


@dataclass(frozen=True)
class Limits:
    """What the state may hold (see the module docstring)."""

    tenants: int = 256
    bases_per_tenant: int = 16
    chars_per_tenant: int = 4_500_000
    chars_total: int = 64_000_000
    ttl_s: float = 24 * 3600.0


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

    @property
    def size(self) -> int:
        """The characters it holds (texts and errata)."""
        return sum(map(len, self.texts)) + sum(map(len, self.errata.values()))

    def texts_json(self) -> str:
        return json.dumps({"model": self.model, "route": self.route, "roles": self.roles,
                           "texts": self.texts})

    def state_json(self) -> str:
        pending = self.pending and [self.pending[0], self.pending[1], _items(self.pending[2])]
        return json.dumps({"errata": {str(k): v for k, v in self.errata.items()}, "told": _items(self.told),
                           "labels": _items(self.labels), "pending": pending,
                           "moved": {str(k): [[a, b] for a, b in v] for k, v in self.moved.items()}})

    @classmethod
    def loads(cls, base_id: str, texts: str, state: str | None) -> Base:
        t = json.loads(texts)
        s = json.loads(state) if state else {}
        pending = s.get("pending")
        return cls(base_id, t["model"], t["route"], t["roles"], t["texts"],
                   {int(k): v for k, v in s.get("errata", {}).items()}, _dict(s.get("told", [])),
                   _dict(s.get("labels", [])),
                   None if pending is None else (pending[0], pending[1], _dict(pending[2])),
                   {int(k): {(a, b): "" for a, b in v} for k, v in s.get("moved", {}).items()})


def _items(mapping: dict[tuple[int, int, int], str]) -> list:
    return [[*key, value] for key, value in mapping.items()]


def _dict(items: list) -> dict[tuple[int, int, int], str]:
    return {(a, b, c): value for a, b, c, value in items}


class State:
    """The interface (see the module docstring); `errors`: the exceptions that mean the state could
    not be reached (the request then passes through)."""

    name = "memory"
    errors: tuple[type[BaseException], ...] = ()
    RETRY_S = 5.0  # after a failure, the state is not asked again for this long (requests pass through)

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._down_until = 0.0

    def failed(self) -> None:
        """Note a failure: `down` for `RETRY_S`, so a Redis that hangs costs one timeout, not one per
        request and count."""
        self._down_until = time.monotonic() + self.RETRY_S

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    # --- bases (called under the tenant's `lock`) ----------------------------------------------------
    def lock(self, tenant: str):  # a context manager
        raise NotImplementedError

    def bases(self, tenant: str) -> list[Base]:
        """The tenant's live bases (those past `ttl_s` dropped)."""
        raise NotImplementedError

    def save(self, tenant: str, base: Base, texts: bool) -> None:
        """Keep `base` (its texts too when `texts`) as the tenant's most recent, then apply the bounds."""
        raise NotImplementedError

    def drop(self, tenant: str, base_id: str) -> None:
        raise NotImplementedError

    # --- counts --------------------------------------------------------------------------------------
    def add(self, key: str, counts: dict[str, float]) -> dict[str, float]:
        """Add `counts` to `key`'s (a base's only while it lives); the new values."""
        raise NotImplementedError

    def put(self, key: str, name: str, value: str, only_new: bool = False) -> str:
        """Set one text of `key` (kept when `only_new` and it has one); the value now."""
        raise NotImplementedError

    def read(self, *keys: str) -> list[dict[str, str]]:
        raise NotImplementedError

    def push(self, key: str, value: float, keep: int) -> None:
        raise NotImplementedError

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


class MemoryState(State):
    """This process's memory: tenants in LRU order, each an LRU of its bases."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self._tenants: OrderedDict[str, OrderedDict[str, Base]] = OrderedDict()
        self._used: dict[str, float] = {}  # base id -> last use
        self._counts: dict[str, Counter] = {TOTALS: Counter()}
        self._texts: dict[str, dict[str, str]] = {}
        self._samples: dict[str, deque] = {}
        self._guard = threading.RLock()
        self._locks = [threading.Lock() for _ in range(64)]  # a stripe: bounded, whatever the tenants

    @contextmanager
    def lock(self, tenant: str) -> Iterator[None]:
        with self._locks[zlib.crc32(tenant.encode()) % len(self._locks)]:
            yield

    def bases(self, tenant: str) -> list[Base]:
        with self._guard:
            held = self._tenants.get(tenant, OrderedDict())
            for base_id in [b for b in held if self._used[b] < time.time() - self.limits.ttl_s]:
                self._drop_base(tenant, base_id)
            return list(held.values())

    def save(self, tenant: str, base: Base, texts: bool) -> None:
        with self._guard:
            held = self._tenants.pop(tenant, None) or OrderedDict()
            self._tenants[tenant] = held
            held[base.base_id] = base
            held.move_to_end(base.base_id)
            self._used[base.base_id] = time.time()
            self._counts.setdefault(base.base_id, Counter())
            while held and (len(held) > self.limits.bases_per_tenant
                            or sum(b.size for b in held.values()) > self.limits.chars_per_tenant):
                self._drop_base(tenant, next(iter(held)))  # the base just saved last: alone over, it goes
            while len(self._tenants) > 1 and (len(self._tenants) > self.limits.tenants or sum(
                    b.size for h in self._tenants.values() for b in h.values()) > self.limits.chars_total):
                self._drop_tenant(next(iter(self._tenants)))

    def drop(self, tenant: str, base_id: str) -> None:
        with self._guard:
            self._drop_base(tenant, base_id)

    def _drop_base(self, tenant: str, base_id: str) -> None:
        held = self._tenants.get(tenant)
        if held is not None:
            held.pop(base_id, None)
            if not held:
                del self._tenants[tenant]
        self._used.pop(base_id, None)
        for kind in ("rewritten", "pass_through"):
            self._samples.pop(f"ttft:{base_id}:{kind}", None)
        self._counts.pop(base_id, None)
        self._texts.pop(base_id, None)

    def _drop_tenant(self, tenant: str) -> None:
        for base_id in list(self._tenants.get(tenant, ())):
            self._drop_base(tenant, base_id)

    def add(self, key: str, counts: dict[str, float]) -> dict[str, float]:
        with self._guard:
            held = self._counts.get(key)
            if held is None:
                return {}
            held.update(counts)
            return {name: held[name] for name in counts}

    def put(self, key: str, name: str, value: str, only_new: bool = False) -> str:
        with self._guard:
            if key != TOTALS and key not in self._counts:
                return value
            texts = self._texts.setdefault(key, {})
            if not (only_new and texts.get(name)):
                texts[name] = value
            return texts[name]

    def read(self, *keys: str) -> list[dict[str, str]]:
        with self._guard:
            return [{**{k: str(v) for k, v in self._counts.get(key, {}).items()}, **self._texts.get(key, {})}
                    for key in keys]

    def push(self, key: str, value: float, keep: int) -> None:
        with self._guard:
            if key.split(":")[1] in self._used:
                self._samples.setdefault(key, deque(maxlen=keep)).append(value)

    def samples(self, key: str) -> list[float]:
        with self._guard:
            return list(self._samples.get(key, ()))

    def recent(self, n: int) -> list[str]:
        with self._guard:
            return sorted(self._used, key=self._used.__getitem__, reverse=True)[:n]

    def sizes(self) -> tuple[int, int]:
        with self._guard:
            return len(self._tenants), len(self._used)
