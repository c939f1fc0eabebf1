"""What joins the KV store's two tiers: where a lookup's notes came from (`Reuse`), the shared tier's
index in Redis (`SharedIndex`), and `Shared`, the tier plus its index as `KVStore` uses them.

The index holds, under `kvnotes:kv:<bucket>/<prefix>:`, each object's size (`bytes` hash), its last
use (`lru` sorted set, seconds), the running total (`total`), the counters of every worker
(`counters` hash: hits, misses, evictions, damaged, dropped) and each worker's upload queue in bytes
(`queue:<host>:<pid>`, expiring a minute after its last report). Recording an object is one Lua
script (size, total and last use together). A write that finds the total over the budget takes a
lock (a random token, released only by a script that checks it is still its own) and runs one Lua
script that pops least-recently-used objects (ZPOPMIN) down to 90% of the budget (`LOW_WATERMARK`),
so a full tier evicts once per 10% of writes, not on every one; the caller deletes the objects.

Every index call runs on the tier's writer thread (`SharedTier.submit`), never in a run, behind its
own breaker (`vocabulary.breaker.Breaker`): an index that refuses or hangs costs one timeout per
`retry_s`, and meanwhile the budget and the counters, never a lookup (objects are read by name).

The tier heals: an object found damaged is deleted and forgotten; a chain that breaks at an object
the index lists is checked, and the listed-but-absent objects are forgotten (all of them at once
when the bucket came back empty: the index is reset), so the next worker holding them, which offers
every block it keeps (`Shared.offer`), uploads them again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from worker.engine.store_redis import INDEX_TIMEOUT_S, SharedIndex
from worker.engine.store_s3 import SharedConfig, SharedTier, TierFault

__all__ = ["Reuse", "Shared", "SharedIndex"]

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


REPORT_S = 1.0  # how often the writer reports its queue's bytes and drops to the index


class Shared:
    """The shared tier as the store uses it: look a chain up (counted), publish a written file and
    offer a kept one in the background (recorded in the index, evicting over budget), drop a damaged
    one, heal the index, report stats. Nothing here waits on Redis in the caller's thread."""

    def __init__(self, config: SharedConfig) -> None:
        self.config = config
        self.tier = SharedTier(config)
        namespace = f"{self.tier.bucket}/{self.tier.prefix}"
        self.index = SharedIndex(config.index_url, namespace, min(config.timeout_s, INDEX_TIMEOUT_S),
                                 config.retry_s) if config.index_url else None
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._reported = (0.0, -1, 0)  # (when, queued bytes, drops) last reported
        self.tier.on_idle = self._report

    def _later(self, job: Callable[[], None]) -> None:
        self.tier.submit(job)

    def lookup(self, kind: str, keys: list[str], reuse: Reuse) -> dict[str, bytes]:
        """The objects of the chain `keys` up to the first absent one (`SharedTier.chain`), by key;
        {} when the tier faults (`reuse` says how). The index hears one pipeline, later."""
        if not keys:
            return {}
        paths = [self.tier.path(kind, k) for k in keys]
        try:
            found = self.tier.chain(paths)
        except TierFault as fault:
            reuse.shared_fault = reuse.shared_fault or fault.reason
            return {}
        missing = len(found) < len(paths)
        self.tier.counters.hits += len(found)
        self.tier.counters.misses += int(missing)
        if self.index is not None:
            index, read = self.index, paths[: len(found)]
            self._later(lambda: index.after_lookup(read, hits=len(read), misses=int(missing)))
            if missing:
                rest = paths[len(found):]
                self._later(lambda: self._heal_missing(rest))
        return {k: data for k, data in zip(keys, found, strict=False)}

    def publish(self, kind: str, key: str, data: bytes) -> None:
        """Upload a file just written, in the background (bounded in bytes). A block the index
        already lists is only marked used (its bytes are its key's); a manifest is written again,
        since a skill saved after its prefill adds segments."""
        path = self.tier.path(kind, key)

        def job() -> None:
            if kind == "block" and self.index is not None and self.index.known([path]) == [True]:
                self.index.touch([path])
                return  # (an index that cannot say: uploaded; the bytes are the same)
            if self.tier.upload(path, data):
                self._written(path, len(data))
        self.tier.submit(job, len(data))

    def offer(self, kind: str, files: list[tuple[str, Path]]) -> None:
        """Blocks this worker keeps and did not write now: in the background, each the index does
        not list (lost, damaged, or the bucket emptied) is read from its file and uploaded again;
        the others are marked used."""
        if not files or self.index is None:
            return
        paths = [(self.tier.path(kind, key), file) for key, file in files]

        def job() -> None:
            listed = self.index.known([p for p, _ in paths])
            if listed is None:
                return  # the index cannot say: nothing to heal now
            self.index.touch([p for (p, _), known in zip(paths, listed) if known])
            for (path, file), known in zip(paths, listed):
                if known:
                    continue
                try:
                    data = file.read_bytes()
                except OSError:
                    continue
                if self.tier.counters.queued_bytes + len(data) > self.config.upload_bytes:
                    self.tier._dropped_upload(len(data), "queue full")
                    continue
                if not self.tier.upload(path, data):
                    return
                self._written(path, len(data))
        self._later(job)

    def drop_damaged(self, kind: str, key: str, reuse: Reuse) -> None:
        """A shared object failed its checksum or its key: delete it and forget it, in the background
        (before any upload queued after it), so the caller's `put` writes it again."""
        path = self.tier.path(kind, key)
        reuse.shared_fault = reuse.shared_fault or "damaged"
        self.tier.counters.damaged += 1
        log.warning("kv store: deleting a damaged shared object", extra={"path": path})

        def job() -> None:
            try:
                self.tier.delete(path)
            except TierFault:
                pass
            if self.index is not None:
                self.index.forget([path])
                self.index.count(damaged=1)
        self._later(job)

    def _heal_missing(self, paths: list[str]) -> None:
        """A chain broke at `paths[0]`: objects the index lists but the bucket lacks are forgotten
        (so they are uploaded again); all of them when the bucket came back empty."""
        assert self.index is not None
        listed = [p for p, known in zip(paths, self.index.known(paths) or []) if known]
        if not listed:
            return
        try:
            empty = self.tier.is_empty()
        except TierFault:
            return
        if empty:
            self.index.reset()
            log.warning("kv store: the shared bucket came back empty; its index is reset",
                        extra={"bucket": self.tier.bucket, "prefix": self.tier.prefix})
        else:
            n = self.index.forget(listed)
            log.warning("kv store: the shared index listed objects the bucket lacks; forgotten",
                        extra={"objects": n})

    def _written(self, path: str, size: int) -> None:
        if self.index is None:
            return
        total = self.index.record(path, size)
        if total <= self.config.budget_bytes:
            return
        for victim in self.index.over_budget(self.config.budget_bytes):
            try:
                self.tier.delete(victim)
            except TierFault:
                return

    def _report(self) -> None:
        """On the writer thread: the queue's bytes and the drops since, at most once per REPORT_S."""
        if self.index is None:
            return
        when, queued, dropped = self._reported
        c = self.tier.counters
        now = time.monotonic()
        if now - when < REPORT_S or (queued == c.queued_bytes and dropped == c.dropped and now - when < 30):
            return
        if self.index.report(self.worker, c.queued_bytes, c.dropped - dropped):
            self._reported = (now, c.queued_bytes, c.dropped)
        else:
            self._reported = (now, queued, dropped)

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> str:
        said = self.tier.close(drain, timeout_s)
        if self.index is not None:  # the last drops (abandoned ones too) and an empty queue
            self._reported = (0.0, -1, self._reported[2])
            c = self.tier.counters
            self.index.report(self.worker, 0, c.dropped - self._reported[2])
        return said

    def stats(self) -> dict[str, int | str]:
        c = self.tier.counters
        mine = {"process_hits": c.hits, "process_misses": c.misses, "written": c.written,
                "process_dropped": c.dropped, "faults": c.faults, "process_queued_bytes": c.queued_bytes,
                "process_peak_bytes": c.peak_bytes, "upload_bytes": self.config.upload_bytes}
        shared = self.index.stats() if self.index is not None else {}
        return {"url": self.config.url, "budget_bytes": self.config.budget_bytes, **shared, **mine}
