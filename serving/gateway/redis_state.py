"""`RedisState`: the gateway's state (`serving.gateway.state`, whose docstring names the keys) in one
Redis, shared by every process and replica given the same URL. A tenant's plan holds the tenant's
Redis lock; counts are `HINCRBY`s, exact across processes. Every key expires `ttl_s` after its last
write, so what a crashed process left behind goes by itself.

`open_state(url, limits)` makes the state from a URL: "" or "memory" is this process's memory;
`redis://HOST:PORT/DB` (a `#prefix` fragment sets the key prefix, default `kvnotes:gateway:`).
"""

from __future__ import annotations

import time

import redis

from serving.gateway.state import TOTALS, Base, Limits, MemoryState, State

PREFIX = "kvnotes:gateway:"
LOCK_S = 30.0  # a tenant's lock expires after this (a plan holding it died with its process)
WAIT_S = 10.0  # a request waits this long for its tenant's lock, then passes through


def open_state(url: str, limits: Limits) -> State:
    """The state `url` names (see the module docstring)."""
    if url in ("", "memory"):
        return MemoryState(limits)
    address, _, prefix = url.partition("#")
    return RedisState(address, limits, prefix or PREFIX)


class RedisState(State):
    """The state in Redis (see the module docstring)."""

    errors = (redis.RedisError,)

    def __init__(self, url: str, limits: Limits, prefix: str = PREFIX) -> None:
        super().__init__(limits)
        self.name = url.split("@")[-1]  # no password in the page or the log
        self.p = prefix
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=1.0,
                                      socket_timeout=2.0, health_check_interval=30)

    def _ttl(self) -> int:
        return max(1, int(self.limits.ttl_s))

    def lock(self, tenant: str):
        return self.r.lock(f"{self.p}lock:{tenant}", timeout=LOCK_S, blocking_timeout=WAIT_S)

    def bases(self, tenant: str) -> list[Base]:
        used = self.r.zrange(f"{self.p}u:{tenant}", 0, -1, withscores=True)
        old = [b for b, at in used if at < time.time() - self.limits.ttl_s]
        for base_id in old:
            self.drop(tenant, base_id)
        held = self.r.hgetall(f"{self.p}b:{tenant}")
        return [Base.loads(b, held[b], held.get(f"{b}:s")) for b, _ in used if b not in old and b in held]

    def save(self, tenant: str, base: Base, texts: bool) -> None:
        now, p, ttl = time.time(), self.p, self._ttl()
        fields = {f"{base.base_id}:s": base.state_json()}
        if texts:
            fields[base.base_id] = base.texts_json()
        pipe = self.r.pipeline()
        pipe.hset(f"{p}b:{tenant}", mapping=fields)
        pipe.zadd(f"{p}u:{tenant}", {base.base_id: now})
        pipe.zadd(f"{p}recent", {base.base_id: now})
        pipe.zadd(f"{p}tenants", {tenant: now})
        pipe.hsetnx(f"{p}c:{base.base_id}", "requests", 0)
        for key in (f"b:{tenant}", f"u:{tenant}", "recent", "tenants", f"c:{base.base_id}"):
            pipe.expire(p + key, ttl)
        pipe.execute()
        self._bound_tenant(tenant)
        self._bound_all(tenant)

    def _sizes(self, tenant: str) -> list[tuple[str, int]]:
        """The tenant's bases, least recently used first, with the characters each holds."""
        used = self.r.zrange(f"{self.p}u:{tenant}", 0, -1)
        held = self.r.hgetall(f"{self.p}b:{tenant}")
        return [(b, Base.loads(b, held[b], held.get(f"{b}:s")).size) for b in used if b in held]

    def _bound_tenant(self, tenant: str) -> None:
        sizes = self._sizes(tenant)
        while sizes and (len(sizes) > self.limits.bases_per_tenant
                         or sum(s for _, s in sizes) > self.limits.chars_per_tenant):
            self.drop(tenant, sizes.pop(0)[0])
        pipe = self.r.pipeline()
        pipe.hset(f"{self.p}sizes", tenant, sum(s for _, s in sizes))
        pipe.hset(f"{self.p}counts", tenant, len(sizes))
        pipe.execute()

    def _bound_all(self, current: str) -> None:
        """Drop the least recently used tenants (never `current`) past the overall bounds, and any
        idle past `ttl_s`."""
        p = self.p
        tenants = self.r.zrange(f"{p}tenants", 0, -1, withscores=True)
        sizes = {t: int(n) for t, n in self.r.hgetall(f"{p}sizes").items()}
        total = sum(sizes.get(t, 0) for t, _ in tenants)
        for tenant, at in tenants:
            over = len(tenants) > self.limits.tenants or total > self.limits.chars_total
            if tenant == current or not (over or at < time.time() - self.limits.ttl_s):
                continue
            self._drop_tenant(tenant)
            total -= sizes.get(tenant, 0)
            tenants = [(t, a) for t, a in tenants if t != tenant]
        stale = set(sizes) - {t for t, _ in tenants}  # expired by Redis: forget their sizes too
        if stale:
            self.r.hdel(f"{p}sizes", *stale)
            self.r.hdel(f"{p}counts", *stale)

    def _drop_tenant(self, tenant: str) -> None:
        for base_id in self.r.zrange(f"{self.p}u:{tenant}", 0, -1):
            self.drop(tenant, base_id)
        pipe = self.r.pipeline()
        pipe.delete(f"{self.p}b:{tenant}", f"{self.p}u:{tenant}")
        pipe.zrem(f"{self.p}tenants", tenant)
        pipe.hdel(f"{self.p}sizes", tenant)
        pipe.hdel(f"{self.p}counts", tenant)
        pipe.execute()

    def drop(self, tenant: str, base_id: str) -> None:
        p = self.p
        pipe = self.r.pipeline()
        pipe.hdel(f"{p}b:{tenant}", base_id, f"{base_id}:s")
        pipe.zrem(f"{p}u:{tenant}", base_id)
        pipe.zrem(f"{p}recent", base_id)
        pipe.delete(f"{p}c:{base_id}", f"{p}l:ttft:{base_id}:rewritten", f"{p}l:ttft:{base_id}:pass_through")
        pipe.execute()

    def _live(self, key: str) -> bool:
        return key == TOTALS or self.r.zscore(f"{self.p}recent", key) is not None

    def add(self, key: str, counts: dict[str, float]) -> dict[str, float]:
        if not self._live(key):
            return {}
        pipe = self.r.pipeline()
        for name, n in counts.items():
            if isinstance(n, int):
                pipe.hincrby(f"{self.p}c:{key}", name, n)
            else:
                pipe.hincrbyfloat(f"{self.p}c:{key}", name, n)
        if key != TOTALS:
            pipe.expire(f"{self.p}c:{key}", self._ttl())
        return {name: float(v) for name, v in zip(counts, pipe.execute())}

    def put(self, key: str, name: str, value: str, only_new: bool = False) -> str:
        if not self._live(key):
            return value
        if only_new:
            self.r.hsetnx(f"{self.p}c:{key}", name, value)
            return self.r.hget(f"{self.p}c:{key}", name) or value
        self.r.hset(f"{self.p}c:{key}", name, value)
        return value

    def read(self, *keys: str) -> list[dict[str, str]]:
        pipe = self.r.pipeline()
        for key in keys:
            pipe.hgetall(f"{self.p}c:{key}")
        return pipe.execute() if keys else []

    def push(self, key: str, value: float, keep: int) -> None:
        if not self._live(key.split(":")[1]):
            return
        pipe = self.r.pipeline()
        pipe.lpush(f"{self.p}l:{key}", value)
        pipe.ltrim(f"{self.p}l:{key}", 0, keep - 1)
        pipe.expire(f"{self.p}l:{key}", self._ttl())
        pipe.execute()

    def samples(self, key: str) -> list[float]:
        return [float(v) for v in self.r.lrange(f"{self.p}l:{key}", 0, -1)]

    def recent(self, n: int) -> list[str]:
        return self.r.zrevrange(f"{self.p}recent", 0, n - 1)

    def sizes(self) -> tuple[int, int]:
        return self.r.zcard(f"{self.p}tenants"), self.r.zcard(f"{self.p}recent")

    def close(self) -> None:
        self.r.close()
