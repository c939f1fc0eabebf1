"""`RedisState`: the gateway's state (`serving.gateway.state`, whose docstring names the keys and the
interface) in one Redis, shared by every process and replica given the same URL. A tenant's plan
holds the tenant's Redis lock (`SET NX PX` with a token of its own, released only by its holder);
a save is one Lua script that checks that token (the fence), writes the base and its index entry,
and applies every bound (the tenant's, the TTL's, the overall ones) in the same atomic step; counts
are one Lua call per key (added only while the base lives), many keys per pipeline. Every key
expires `ttl_s` after its last write, so what a crashed process left behind goes by itself.

What holds prompt text (a base's texts and its errata state, the labels of its fields) is sealed
(`serving.gateway.sealing`: AES-GCM under the gateway's secret, the Redis key and field as
associated data) when written and opened when read (`_seal`, `_unseal`); a value that does not open
(a replica given another secret, or an altered value) is read as absent, and logged.

`open_state(url, limits)` makes the state from a URL: "" or "memory" is this process's memory;
`redis://HOST:PORT/DB` (a `#prefix` fragment sets the key prefix, default `kvnotes:gateway:`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from serving.gateway.memory_state import MemoryState
from serving.gateway.sealing import Sealer, Unsealable
from serving.gateway.state import (
    TOTALS,
    Base,
    BaseInfo,
    Lease,
    Limits,
    LockBusy,
    State,
    new_token,
)

log = logging.getLogger("kvnotes.gateway")
PREFIX = "kvnotes:gateway:"
SEALED = ("labels",)  # the texts of a base's counts that hold prompt text
LOCK_S = 30.0  # a tenant's lock expires after this (a plan holding it died with its process)
POLL_S = 0.02  # between two tries for a held lock

# drop one base (prefix, tenant, id): used by the scripts below
_DROP = """
local function drop_base(p, t, id)
  redis.call('HDEL', p..'b:'..t, id, id..':s')
  redis.call('HDEL', p..'i:'..t, id)
  redis.call('ZREM', p..'u:'..t, id)
  redis.call('ZREM', p..'recent', id)
  redis.call('DEL', p..'c:'..id, p..'l:ttft:'..id..':rewritten', p..'l:ttft:'..id..':pass_through')
end
local function drop_tenant(p, t)
  for _, id in ipairs(redis.call('ZRANGE', p..'u:'..t, 0, -1)) do drop_base(p, t, id) end
  redis.call('DEL', p..'b:'..t, p..'u:'..t, p..'i:'..t)
  redis.call('ZREM', p..'tenants', t)
  redis.call('HDEL', p..'sizes', t)
  redis.call('HDEL', p..'counts', t)
end
-- the tenant's sizes and counts from its index (bases least recent first dropped past the bounds)
local function bound_tenant(p, t, bases, chars)
  local ids = redis.call('ZRANGE', p..'u:'..t, 0, -1)
  local sizes, total = {}, 0
  for k, id in ipairs(ids) do
    local entry = redis.call('HGET', p..'i:'..t, id)
    sizes[k] = entry and cjson.decode(entry).size or 0
    total = total + sizes[k]
  end
  local n, k = #ids, 1
  while n > 0 and (n > bases or total > chars) do
    drop_base(p, t, ids[k]); total = total - sizes[k]; n = n - 1; k = k + 1
  end
  if n == 0 then drop_tenant(p, t) return 0 end
  redis.call('HSET', p..'sizes', t, total)
  redis.call('HSET', p..'counts', t, n)
  return n
end
"""

# ARGV: prefix, tenant, token ('' = unfenced), id, state, texts ('' = kept), index entry, now, ttl,
#       bases per tenant, chars per tenant, tenants, chars in all. -1: the lease was lost; -2: the
#       base's texts are gone (dropped meanwhile); else the tenant's bases after the bounds.
_SAVE = _DROP + """
local p, t, token, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
if token ~= '' and redis.call('GET', p..'lock:'..t) ~= token then return -1 end
for _, old in ipairs(redis.call('ZRANGEBYSCORE', p..'u:'..t, '-inf', now - ttl)) do drop_base(p, t, old) end
if ARGV[6] ~= '' then
  redis.call('HSET', p..'b:'..t, id, ARGV[6])
elseif redis.call('HEXISTS', p..'b:'..t, id) == 0 then
  return -2
end
redis.call('HSET', p..'b:'..t, id..':s', ARGV[5])
redis.call('HSET', p..'i:'..t, id, ARGV[7])
redis.call('ZADD', p..'u:'..t, now, id)
redis.call('ZADD', p..'recent', now, id)
redis.call('ZADD', p..'tenants', now, t)
redis.call('HSETNX', p..'c:'..id, 'requests', 0)
for _, key in ipairs({'b:'..t, 'u:'..t, 'i:'..t, 'recent', 'tenants', 'sizes', 'counts', 'c:'..id}) do
  redis.call('EXPIRE', p..key, ttl)
end
local n = bound_tenant(p, t, tonumber(ARGV[10]), tonumber(ARGV[11]))
-- no ghosts: ids and tenants unused past the TTL leave (their keys expired, or go now)
redis.call('ZREMRANGEBYSCORE', p..'recent', '-inf', now - ttl)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', p..'tenants', '-inf', now - ttl)) do drop_tenant(p, old) end
-- the overall bounds: the least recently used tenants go whole, never this one
local tenants = redis.call('ZRANGE', p..'tenants', 0, -1)
local count, total = #tenants, 0
for _, other in ipairs(tenants) do total = total + tonumber(redis.call('HGET', p..'sizes', other) or 0) end
for _, other in ipairs(tenants) do
  if count <= tonumber(ARGV[12]) and total <= tonumber(ARGV[13]) then break end
  if other ~= t then
    total = total - tonumber(redis.call('HGET', p..'sizes', other) or 0)
    drop_tenant(p, other)
    count = count - 1
  end
end
for _, stale in ipairs(redis.call('HKEYS', p..'sizes')) do
  if not redis.call('ZSCORE', p..'tenants', stale) then
    redis.call('HDEL', p..'sizes', stale); redis.call('HDEL', p..'counts', stale)
  end
end
return n
"""

# ARGV: prefix, tenant, id, bases per tenant, chars per tenant
_DROP_ONE = _DROP + """
drop_base(ARGV[1], ARGV[2], ARGV[3])
return bound_tenant(ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
"""

# ARGV: prefix, tenant, id, replica
_REPLICA = """
local entry = redis.call('HGET', ARGV[1]..'i:'..ARGV[2], ARGV[3])
if not entry then return 0 end
local e = cjson.decode(entry)
e.replica = ARGV[4]
redis.call('HSET', ARGV[1]..'i:'..ARGV[2], ARGV[3], cjson.encode(e))
return 1
"""

# ARGV: prefix, key, ttl, then name, delta pairs: the new values, or nil while the base is dead
_ADD = """
local p, key = ARGV[1], ARGV[2]
if key ~= 'totals' and not redis.call('ZSCORE', p..'recent', key) then return nil end
local out = {}
for i = 4, #ARGV, 2 do
  out[#out + 1] = redis.call('HINCRBYFLOAT', p..'c:'..key, ARGV[i], ARGV[i + 1])
end
if key ~= 'totals' then redis.call('EXPIRE', p..'c:'..key, ARGV[3]) end
return out
"""

# ARGV: prefix, sample key (ttft:{id}:{kind}), base id, ttl, keep, then values
_PUSH = """
local p = ARGV[1]
if not redis.call('ZSCORE', p..'recent', ARGV[3]) then return 0 end
for i = 6, #ARGV do redis.call('LPUSH', p..'l:'..ARGV[2], ARGV[i]) end
redis.call('LTRIM', p..'l:'..ARGV[2], 0, tonumber(ARGV[5]) - 1)
redis.call('EXPIRE', p..'l:'..ARGV[2], ARGV[4])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def open_state(url: str, limits: Limits, sealer: Sealer | None = None) -> State:
    """The state `url` names (see the module docstring); `sealer` seals its prompt texts in Redis."""
    if url in ("", "memory"):
        return MemoryState(limits)
    address, _, prefix = url.partition("#")
    return RedisState(address, limits, prefix or PREFIX, sealer)


class RedisState(State):
    """The state in Redis (see the module docstring)."""

    errors = (redis.RedisError,)

    def __init__(self, url: str, limits: Limits, prefix: str = PREFIX, sealer: Sealer | None = None) -> None:
        super().__init__(limits)
        self.sealer = sealer
        self.name = url.split("@")[-1]  # no password in the page or the log
        self.p = prefix
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=1.0,
                                      socket_timeout=2.0, health_check_interval=30)
        self._save = self.r.register_script(_SAVE)
        self._drop_one = self.r.register_script(_DROP_ONE)
        self._replica = self.r.register_script(_REPLICA)
        self._add = self.r.register_script(_ADD)
        self._push = self.r.register_script(_PUSH)
        self._release = self.r.register_script(_RELEASE)
        self._orphans: deque[tuple[str, str]] = deque(maxlen=64)  # locks whose release failed

    def _ttl(self) -> int:
        return max(1, int(self.limits.ttl_s))

    # --- texts: the one place they cross to and from Redis (issue 48 seals them here) ----------------
    def _seal(self, tenant: str, field: str, texts: str) -> str:
        """`texts` sealed for the field `field` of the tenant's bases (`{id}` or `{id}:s`)."""
        return self.sealer.seal(texts, f"{self.p}b:{tenant}/{field}") if self.sealer else texts

    def _unseal(self, tenant: str, field: str, stored: str | None) -> str | None:
        """`stored` opened (None when absent or it does not open: logged)."""
        if stored is None or self.sealer is None:
            return stored
        try:
            return self.sealer.open(stored, f"{self.p}b:{tenant}/{field}")
        except Unsealable as exc:
            log.warning("gateway state value unreadable: read as absent", extra={"error": str(exc)})
            return None

    # --- bases ---------------------------------------------------------------------------------------
    @contextmanager
    def lock(self, tenant: str, wait_s: float) -> Iterator[Lease]:
        """The tenant's lock (`LockBusy` past `wait_s`). A release that failed (Redis paused or gone
        while the plan held the lock) is remembered, and done before the next lock is asked for:
        the tenant is not blocked for `LOCK_S` once Redis is back."""
        self._release_orphans()
        key, token = f"{self.p}lock:{tenant}", new_token()
        deadline = time.monotonic() + wait_s
        while not self.r.set(key, token, nx=True, px=int(LOCK_S * 1000)):
            if time.monotonic() >= deadline:
                raise LockBusy(f"tenant lock not acquired within {wait_s:g} s")
            time.sleep(POLL_S)
        try:
            yield Lease(tenant, token)
        finally:
            try:
                self._release(keys=[key], args=[token])
            except redis.RedisError:
                self._orphan(key, token)

    def _orphan(self, key: str, token: str) -> None:
        self._orphans.append((key, token))

    def _release_orphans(self) -> None:
        while self._orphans:
            try:
                key, token = self._orphans.popleft()
            except IndexError:
                return
            try:
                self._release(keys=[key], args=[token])
            except redis.RedisError:
                self._orphans.appendleft((key, token))  # kept; this plan passes through
                raise

    def index(self, tenant: str) -> list[BaseInfo]:
        pipe = self.r.pipeline(transaction=False)
        pipe.zrange(f"{self.p}u:{tenant}", 0, -1, withscores=True)
        pipe.hgetall(f"{self.p}i:{tenant}")
        used, entries = pipe.execute()
        since = time.time() - self.limits.ttl_s
        return [BaseInfo.loads(b, entries[b], at) for b, at in used if at >= since and b in entries]

    def load(self, tenant: str, base_ids: list[str]) -> list[Base]:
        if not base_ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(f"{self.p}b:{tenant}", [n for b in base_ids for n in (b, f"{b}:s")])
        pipe.hmget(f"{self.p}i:{tenant}", base_ids)
        held, entries = pipe.execute()
        out = []
        for k, base_id in enumerate(base_ids):
            texts, entry = self._unseal(tenant, base_id, held[2 * k]), entries[k]
            state = self._unseal(tenant, f"{base_id}:s", held[2 * k + 1])
            if texts is not None and entry is not None:
                replica = BaseInfo.loads(base_id, entry, 0.0).replica
                out.append(Base.loads(base_id, texts, state, replica))
        return out

    def save(self, tenant: str, base: Base, texts: bool, lease: Lease | None = None) -> bool:
        lim = self.limits
        sealed = self._seal(tenant, base.base_id, base.texts_json()) if texts else ""
        state = self._seal(tenant, f"{base.base_id}:s", base.state_json())
        done = self._save(args=[self.p, tenant, lease.token if lease else "", base.base_id, state, sealed,
                                base.info().json(), time.time(), self._ttl(), lim.bases_per_tenant,
                                lim.chars_per_tenant, lim.tenants, lim.chars_total])
        return int(done) >= 0

    def drop(self, tenant: str, base_id: str) -> None:
        self._drop_one(args=[self.p, tenant, base_id, self.limits.bases_per_tenant,
                             self.limits.chars_per_tenant])

    def set_replica(self, tenant: str, base_id: str, replica: str) -> None:
        self._replica(args=[self.p, tenant, base_id, replica])

    # --- counts --------------------------------------------------------------------------------------
    def add(self, key: str, counts: dict[str, float]) -> dict[str, float]:
        values = self._add(args=[self.p, key, self._ttl(), *[x for kv in counts.items() for x in kv]])
        return {} if values is None else {name: float(v) for name, v in zip(counts, values)}

    def add_many(self, counts: dict[str, dict[str, float]], samples: dict[str, list[float]],
                 keep: int) -> None:
        pipe = self.r.pipeline(transaction=False)
        for key, values in counts.items():
            self._add(args=[self.p, key, self._ttl(), *[x for kv in values.items() for x in kv]], client=pipe)
        for key, values in samples.items():
            self._push(args=[self.p, key, key.split(":")[1], self._ttl(), keep, *values], client=pipe)
        if counts or samples:
            pipe.execute()

    def put(self, key: str, name: str, value: str, only_new: bool = False) -> str:
        if key != TOTALS and self.r.zscore(f"{self.p}recent", key) is None:
            return value
        if name in SEALED:  # never only_new: a sealed value differs every time it is written
            self.r.hset(f"{self.p}c:{key}", name, self._seal_count(key, name, value))
            return value
        if only_new:
            self.r.hsetnx(f"{self.p}c:{key}", name, value)
            return self.r.hget(f"{self.p}c:{key}", name) or value
        self.r.hset(f"{self.p}c:{key}", name, value)
        return value

    def read(self, *keys: str) -> list[dict[str, str]]:
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(f"{self.p}c:{key}")
        read = pipe.execute() if keys else []
        for key, values in zip(keys, read):
            for name in SEALED:
                if name in values:
                    values[name] = self._unseal_count(key, name, values[name])
        return read

    def _seal_count(self, key: str, name: str, value: str) -> str:
        return self.sealer.seal(value, f"{self.p}c:{key}/{name}") if self.sealer else value

    def _unseal_count(self, key: str, name: str, stored: str) -> str:
        if self.sealer is None:
            return stored
        try:
            return self.sealer.open(stored, f"{self.p}c:{key}/{name}")
        except Unsealable as exc:
            log.warning("gateway state value unreadable: read as absent", extra={"error": str(exc)})
            return ""

    def samples(self, key: str) -> list[float]:
        return [float(v) for v in self.r.lrange(f"{self.p}l:{key}", 0, -1)]

    def recent(self, n: int) -> list[str]:
        since = time.time() - self.limits.ttl_s
        return self.r.zrevrangebyscore(f"{self.p}recent", "+inf", since, start=0, num=n)

    def sizes(self) -> tuple[int, int]:
        since = time.time() - self.limits.ttl_s
        pipe = self.r.pipeline(transaction=False)
        pipe.zcount(f"{self.p}tenants", since, "+inf")
        pipe.zcount(f"{self.p}recent", since, "+inf")
        tenants, bases = pipe.execute()
        return tenants, bases

    def close(self) -> None:
        self.r.close()
