"""The KV store's shared tier's index in Redis (`SharedIndex`; `worker.engine.store_tiers` says
what it holds and who calls it): each call behind one breaker, the updates that must be atomic as
Lua scripts (record, forget, evict to the low watermark, release the eviction lock by its token).
"""

from __future__ import annotations

import logging
import time
import uuid

from vocabulary.breaker import Breaker

log = logging.getLogger("worker.engine.store")

LOW_WATERMARK = 0.9  # eviction goes down to this share of the budget
INDEX_TIMEOUT_S = 2.0  # at most, per Redis call (the tier's own timeout when shorter)
COUNTERS = ("hits", "misses", "evictions", "damaged", "dropped")

# KEYS: bytes, total, lru. ARGV: path, size, now. Adds the object once; always marks its use.
_RECORD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('INCRBY', KEYS[2], ARGV[2])
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return tonumber(redis.call('GET', KEYS[2]) or '0')
"""
# KEYS: bytes, total, lru. ARGV: paths... Forgets each listed one.
_FORGET = """
local n = 0
for _, path in ipairs(ARGV) do
  local size = redis.call('HGET', KEYS[1], path)
  if size then
    redis.call('HDEL', KEYS[1], path)
    redis.call('DECRBY', KEYS[2], size)
    n = n + 1
  end
  redis.call('ZREM', KEYS[3], path)
end
return n
"""
# KEYS: bytes, total, lru, counters. ARGV: budget, low. Pops least-recently-used objects until the
# total is at most `low`, when it is over `budget`; returns their paths.
_EVICT = """
local total = tonumber(redis.call('GET', KEYS[2]) or '0')
if total <= tonumber(ARGV[1]) then return {} end
local low = tonumber(ARGV[2])
local victims = {}
while total > low do
  local popped = redis.call('ZPOPMIN', KEYS[3])
  if #popped == 0 then break end
  local path = popped[1]
  local size = tonumber(redis.call('HGET', KEYS[1], path) or '0')
  redis.call('HDEL', KEYS[1], path)
  total = total - size
  victims[#victims + 1] = path
end
if total < 0 then total = 0 end
redis.call('SET', KEYS[2], total)
redis.call('HINCRBY', KEYS[4], 'evictions', #victims)
return victims
"""
# KEYS: lock. ARGV: token. Deletes the lock only while it is still this token's.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class SharedIndex:
    """The shared tier's index in Redis (see the module docstring), behind one breaker."""

    def __init__(self, url: str, namespace: str, timeout_s: float = INDEX_TIMEOUT_S,
                 retry_s: float = 5.0) -> None:
        import redis

        self._r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._ns = f"kvnotes:kv:{namespace}:"
        self.breaker = Breaker(f"kv shared index {namespace}", retry_s)
        self._logged = False
        self._record = self._r.register_script(_RECORD)
        self._forget = self._r.register_script(_FORGET)
        self._evict = self._r.register_script(_EVICT)
        self._release = self._r.register_script(_RELEASE)

    def _keys(self, *names: str) -> list[str]:
        return [self._ns + n for n in names]

    def _guard(self, default, action):
        import redis

        if not self.breaker.allow():
            return default
        try:
            out = action()
        except redis.RedisError as exc:
            self.breaker.failure()
            if not self._logged:
                self._logged = True
                log.warning("kv store: shared index unreachable; no budget or counters meanwhile",
                            extra={"reason": str(exc)[:200], "retry_s": self.breaker.retry_s})
            return default
        self.breaker.success()
        if self._logged:
            self._logged = False
            log.info("kv store: shared index reachable again")
        return out

    def known(self, paths: list[str]) -> list[bool] | None:
        """Whether the index lists each path (one pipeline); None when it cannot answer."""
        def go() -> list[bool]:
            pipe = self._r.pipeline(transaction=False)
            for path in paths:
                pipe.hexists(self._ns + "bytes", path)
            return [bool(x) for x in pipe.execute()]
        return self._guard(None, go) if paths else []

    def record(self, path: str, size: int) -> int:
        """List the object (once) and mark its use, atomically; returns the tier's total (-1: unknown)."""
        return int(self._guard(-1, lambda: self._record(keys=self._keys("bytes", "total", "lru"),
                                                          args=[path, size, time.time()])))

    def after_lookup(self, touched: list[str], **deltas: int) -> None:
        """One pipeline per lookup: mark what was read as used and add to the counters."""
        def go() -> None:
            pipe = self._r.pipeline(transaction=False)
            if touched:
                pipe.zadd(self._ns + "lru", dict.fromkeys(touched, time.time()))
            for name, delta in deltas.items():
                if delta:
                    pipe.hincrby(self._ns + "counters", name, delta)
            pipe.execute()
        if touched or any(deltas.values()):
            self._guard(None, go)

    def touch(self, paths: list[str]) -> None:
        self.after_lookup(paths)

    def count(self, **deltas: int) -> None:
        self.after_lookup([], **deltas)

    def forget(self, paths: list[str]) -> int:
        """Unlist `paths` (sizes, total, last use) in one script; how many were listed."""
        if not paths:
            return 0
        return int(self._guard(0, lambda: self._forget(keys=self._keys("bytes", "total", "lru"),
                                                         args=list(paths))))

    def over_budget(self, budget: int, low: float = LOW_WATERMARK) -> list[str]:
        """When the total is over `budget`: the least-recently-used paths to delete to bring it to
        `low` x budget, already unlisted (the caller deletes the objects). One script, under a lock
        with a token of its own, so two workers never evict at once and a lock that expired and was
        taken by another worker is never released by this one."""
        def go() -> list[str]:
            total = int(self._r.get(self._ns + "total") or 0)
            if total <= budget:
                return []
            token = uuid.uuid4().hex
            if not self._r.set(self._ns + "evicting", token, nx=True, ex=30):
                return []
            try:
                victims = self._evict(keys=self._keys("bytes", "total", "lru", "counters"),
                                      args=[budget, int(budget * low)])
                return [v.decode() if isinstance(v, bytes) else v for v in victims]
            finally:
                self._release(keys=[self._ns + "evicting"], args=[token])
        return self._guard([], go)

    def report(self, worker: str, queued_bytes: int, dropped: int) -> bool:
        """This worker's upload queue in bytes (kept a minute) and its new drops, in one pipeline."""
        def go() -> bool:
            pipe = self._r.pipeline(transaction=False)
            pipe.set(self._ns + f"queue:{worker}", queued_bytes, ex=60)
            if dropped:
                pipe.hincrby(self._ns + "counters", "dropped", dropped)
            pipe.execute()
            return True
        return bool(self._guard(False, go))

    def reset(self) -> None:
        """Forget every object (the bucket came back empty); the counters stay."""
        self._guard(None, lambda: self._r.delete(*self._keys("bytes", "lru", "total")))

    def stats(self) -> dict[str, int]:
        def go() -> dict[str, int]:
            counters = {k.decode(): int(v) for k, v in self._r.hgetall(self._ns + "counters").items()}
            queues = list(self._r.scan_iter(match=self._ns + "queue:*", count=100))
            queued = [int(v) for v in self._r.mget(queues) if v is not None] if queues else []
            return {"objects": int(self._r.hlen(self._ns + "bytes")),
                    "bytes": int(self._r.get(self._ns + "total") or 0),
                    **{c: counters.get(c, 0) for c in COUNTERS},
                    "queued_bytes": sum(queued), "queues": len(queued)}
        return self._guard({}, go)

    def clear(self) -> None:
        """Forget everything (tests and benches starting from an empty tier)."""
        def go() -> None:
            queues = list(self._r.scan_iter(match=self._ns + "queue:*", count=100))
            self._r.delete(*self._keys("bytes", "lru", "total", "counters", "evicting"), *queues)
        self._guard(None, go)
