"""`MemoryState`: the gateway's state (`serving.gateway.state`, whose docstring names the interface) in
this process's memory, as `kvnotes gateway` keeps it without `--state`: tenants in LRU order, each an
LRU of its bases; one lock per tenant, with a timeout as Redis's has."""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager

from serving.gateway.state import TOTALS, Base, BaseInfo, Lease, Limits, LockBusy, State


class _TenantLock:
    """A tenant's lock (a plain lock cannot be weakly referenced)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


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
        # one lock per tenant (never shared: one tenant's wait is never another's), kept only while
        # some thread holds or waits for it
        self._locks: weakref.WeakValueDictionary[str, _TenantLock] = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()

    @contextmanager
    def lock(self, tenant: str, wait_s: float) -> Iterator[Lease]:
        with self._locks_guard:
            held = self._locks.get(tenant)
            if held is None:
                held = self._locks[tenant] = _TenantLock()
        if not held.lock.acquire(timeout=wait_s):
            raise LockBusy(f"tenant lock not acquired within {wait_s:g} s")
        try:
            yield Lease(tenant, "memory")
        finally:
            held.lock.release()

    def _expire(self, tenant: str) -> OrderedDict[str, Base]:
        held = self._tenants.get(tenant, OrderedDict())
        for base_id in [b for b in held if self._used[b] < time.time() - self.limits.ttl_s]:
            self._drop_base(tenant, base_id)
        return held

    def index(self, tenant: str) -> list[BaseInfo]:
        with self._guard:
            return [b.info(self._used[b.base_id]) for b in self._expire(tenant).values()]

    def load(self, tenant: str, base_ids: list[str]) -> list[Base]:
        with self._guard:
            held = self._tenants.get(tenant, {})
            return [held[b] for b in base_ids if b in held]

    def save(self, tenant: str, base: Base, texts: bool, lease: Lease | None = None) -> bool:
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
            for other in list(self._tenants):  # past the TTL, any tenant's
                self._expire(other)
            while len(self._tenants) > 1 and (len(self._tenants) > self.limits.tenants or sum(
                    b.size for h in self._tenants.values() for b in h.values()) > self.limits.chars_total):
                self._drop_tenant(next(iter(self._tenants)))
            return True

    def drop(self, tenant: str, base_id: str) -> None:
        with self._guard:
            self._drop_base(tenant, base_id)

    def set_replica(self, tenant: str, base_id: str, replica: str) -> None:
        with self._guard:
            base = self._tenants.get(tenant, {}).get(base_id)
            if base is not None:
                base.replica = replica

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

    def add_many(self, counts: dict[str, dict[str, float]], samples: dict[str, list[float]],
                 keep: int) -> None:
        with self._guard:
            for key, values in counts.items():
                self.add(key, values)
            for key, values in samples.items():
                if key.split(":")[1] in self._used:
                    self._samples.setdefault(key, deque(maxlen=keep)).extend(values)

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

    def samples(self, key: str) -> list[float]:
        with self._guard:
            return list(self._samples.get(key, ()))

    def recent(self, n: int) -> list[str]:
        with self._guard:
            return sorted(self._used, key=self._used.__getitem__, reverse=True)[:n]

    def sizes(self) -> tuple[int, int]:
        with self._guard:
            return len(self._tenants), len(self._used)
