"""What joins the KV store's two tiers: where a lookup's notes came from (`Reuse`), the shared tier's
index in Redis (`SharedIndex`), and `Shared`, the tier plus its index as `KVStore` uses them.

The index holds, under `kvnotes:kv:<bucket>/<prefix>:`, each object's size (`bytes` hash), its last
use (`lru` sorted set, seconds), the running total (`total`) and the counters of every worker
(`counters` hash: hits, misses, evictions, damaged). A write that finds the total over the budget
takes a short lock and deletes least-recently-used objects until it fits. Redis being down costs the
budget and the counters, never a lookup (objects are read by name, not through the index).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from worker.engine.store_s3 import SharedConfig, SharedTier, TierFault

log = logging.getLogger("worker.engine.store")


@dataclass
class Reuse:
    """One lookup: how many of the sequence's tokens were read from the store, from which tier
    ("local" | "shared"; "" when none), and what went wrong with the shared tier ("" | "unreachable"
    | "missing bucket" | "damaged")."""

    tokens: int = 0
    tier: str = ""
    shared_fault: str = ""

    def to_dict(self) -> dict:
        out: dict = {"tokens": self.tokens, "tier": self.tier or "none"}
        if self.shared_fault:
            out["shared_tier"] = self.shared_fault
        return out


class SharedIndex:
    """The shared tier's index in Redis (see the module docstring)."""

    def __init__(self, url: str, namespace: str, timeout_s: float = 2.0) -> None:
        import redis

        self._r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._ns = f"kvnotes:kv:{namespace}:"
        self._logged = False

    def _guard(self, default, action):
        import redis

        try:
            out = action()
        except redis.RedisError as exc:
            if not self._logged:
                self._logged = True
                log.warning("kv store: shared index unreachable; no budget or counters meanwhile",
                            extra={"reason": str(exc)[:200]})
            return default
        self._logged = False
        return out

    def known(self, path: str) -> bool:
        return bool(self._guard(False, lambda: self._r.hexists(self._ns + "bytes", path)))

    def record(self, path: str, size: int) -> None:
        def go():
            if self._r.hsetnx(self._ns + "bytes", path, size):
                self._r.incrby(self._ns + "total", size)
            self._r.zadd(self._ns + "lru", {path: time.time()})
        self._guard(None, go)

    def touch(self, paths: list[str]) -> None:
        if paths:
            now = time.time()
            self._guard(None, lambda: self._r.zadd(self._ns + "lru", dict.fromkeys(paths, now)))

    def forget(self, path: str) -> None:
        def go():
            size = self._r.hget(self._ns + "bytes", path)
            if size is not None and self._r.hdel(self._ns + "bytes", path):
                self._r.decrby(self._ns + "total", int(size))
            self._r.zrem(self._ns + "lru", path)
        self._guard(None, go)

    def count(self, **deltas: int) -> None:
        def go():
            pipe = self._r.pipeline()
            for name, delta in deltas.items():
                if delta:
                    pipe.hincrby(self._ns + "counters", name, delta)
            pipe.execute()
        if any(deltas.values()):
            self._guard(None, go)

    def over_budget(self, budget: int) -> list[str]:
        """The least-recently-used paths to delete so the total fits `budget` (forgotten here; the
        caller deletes the objects), under a lock so two workers do not evict the same objects."""
        def go() -> list[str]:
            total = int(self._r.get(self._ns + "total") or 0)
            if total <= budget or not self._r.set(self._ns + "evicting", "1", nx=True, ex=30):
                return []
            try:
                victims: list[str] = []
                for raw, _ in self._r.zrange(self._ns + "lru", 0, -1, withscores=True):
                    if total <= budget:
                        break
                    path = raw.decode()
                    size = int(self._r.hget(self._ns + "bytes", path) or 0)
                    self.forget(path)
                    victims.append(path)
                    total -= size
                self._r.hincrby(self._ns + "counters", "evictions", len(victims))
                return victims
            finally:
                self._r.delete(self._ns + "evicting")
        return self._guard([], go)

    def stats(self) -> dict[str, int]:
        def go() -> dict[str, int]:
            counters = {k.decode(): int(v) for k, v in self._r.hgetall(self._ns + "counters").items()}
            return {"objects": int(self._r.hlen(self._ns + "bytes")),
                    "bytes": int(self._r.get(self._ns + "total") or 0),
                    **{c: counters.get(c, 0) for c in ("hits", "misses", "evictions", "damaged")}}
        return self._guard({}, go)

    def clear(self) -> None:
        """Forget everything (tests and benches starting from an empty tier)."""
        self._guard(None, lambda: self._r.delete(*(self._ns + k for k in
                                                   ("bytes", "lru", "total", "counters", "evicting"))))


class Shared:
    """The shared tier as the store uses it: fetch one file (counted), publish one in the background
    (recorded in the index, evicting over budget), drop a damaged one, and report stats."""

    def __init__(self, config: SharedConfig) -> None:
        self.config = config
        self.tier = SharedTier(config)
        namespace = f"{self.tier.bucket}/{self.tier.prefix}"
        self.index = SharedIndex(config.index_url, namespace, config.timeout_s) if config.index_url else None
        self.tier.on_written = self._written

    def fetch(self, kind: str, key: str, reuse: Reuse) -> bytes | None:
        """The file's bytes from the shared tier, or None (absent, or the tier failed: `reuse` says)."""
        path = self.tier.path(kind, key)
        try:
            data = self.tier.get(path)
        except TierFault as fault:
            reuse.shared_fault = reuse.shared_fault or fault.reason
            return None
        if self.index is not None:
            self.index.count(hits=int(data is not None), misses=int(data is None))
            if data is not None:
                self.index.touch([path])
        if data is None:
            self.tier.counters.misses += 1
        else:
            self.tier.counters.hits += 1
        return data

    def publish(self, kind: str, key: str, data: bytes) -> None:
        path = self.tier.path(kind, key)
        # a block's bytes are its key's (another worker wrote it: one object, one more use); a
        # sequence's manifest is written again, since a skill saved after its prefill adds segments
        if kind == "block" and self.index is not None and self.index.known(path):
            self.index.touch([path])
            return
        self.tier.put_later(path, data)

    def drop_damaged(self, kind: str, key: str, reuse: Reuse) -> None:
        """A shared object failed its checksum: delete it (the caller prefills and puts it again)."""
        path = self.tier.path(kind, key)
        reuse.shared_fault = reuse.shared_fault or "damaged"
        self.tier.counters.damaged += 1
        log.warning("kv store: deleting a damaged shared object", extra={"path": path})
        try:
            self.tier.delete(path)
        except TierFault:
            pass
        if self.index is not None:
            self.index.forget(path)
            self.index.count(damaged=1)

    def _written(self, path: str, size: int) -> None:
        if self.index is None:
            return
        self.index.record(path, size)
        for victim in self.index.over_budget(self.config.budget_bytes):
            try:
                self.tier.delete(victim)
            except TierFault:
                return

    def stats(self) -> dict[str, int | str]:
        c = self.tier.counters
        mine = {"process_hits": c.hits, "process_misses": c.misses, "written": c.written,
                "dropped": c.dropped, "faults": c.faults}
        shared = self.index.stats() if self.index is not None else {}
        return {"url": self.config.url, "budget_bytes": self.config.budget_bytes, **shared, **mine}
