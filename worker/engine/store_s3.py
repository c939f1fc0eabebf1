"""The KV store's shared tier: the same content-addressed safetensors files on S3-compatible storage.

`KVStore` (worker.engine.store) keeps its local folder as the near tier and puts this behind it, so a
document prefilled or a skill compiled on one worker is read back by every other (issue 40). The
interface is SGLang HiCache's storage tier: `get`, `set`, `batch_get`, `batch_set`, `exists`.

- Objects are `<prefix>/blocks/ab/<key>.safetensors` and `<prefix>/seqs/ab/<key>.safetensors`, the
  bytes of the local file (checksum in their metadata), keyed by the same SHA-256 chain, so every
  host agrees on a block's name and two workers writing one block write one object.
- The client is obstore: on 500 x 64 KiB objects here it put, headed and got 2-5x as many objects per
  second as boto3 (docs/benchmarks.md, bench/bench_s3_clients.py).
- Writes go through one background thread and a bounded queue: a run never waits on the network
  (a full queue drops the write, counted). `flush` waits for the queue (tests; a worker stopping).
- A fault is a miss: every request has a timeout and no retries; an unreachable endpoint, a missing
  bucket or any other error marks the tier down (logged once), and it is tried again after
  `retry_s`, so it comes back without a restart.
- The index (which objects exist, their sizes, last use, shared counters) is in Redis
  (`SharedIndex`, worker.engine.store_tiers): listing 2,000 objects took 147 ms against 16 ms for
  Redis, and a listing knows no last use. The byte budget is enforced by whichever worker finds the
  total over it, evicting least-recently-used objects.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlparse

log = logging.getLogger("worker.engine.store")

QUEUE_MAX = 4096  # pending background writes; beyond it a write is dropped (counted)


class TierFault(Exception):
    """The shared tier could not answer: `reason` is "unreachable" or "missing bucket"."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class SharedConfig:
    """Where the shared tier is: `url` s3://BUCKET/PREFIX, the endpoint ("" = AWS), its byte budget,
    the Redis URL of its index ("" = none: no budget is enforced), the per-request timeout.
    Credentials come from the usual AWS_* variables."""

    url: str
    endpoint: str = ""
    budget_bytes: int = 64 * 2**30
    index_url: str = ""
    timeout_s: float = 5.0
    threads: int = 16
    retry_s: float = 5.0  # a tier found down is skipped this long (each skip a miss), then tried again

    @property
    def bucket(self) -> str:
        return parse_store_url(self.url)[0]

    @property
    def prefix(self) -> str:
        return parse_store_url(self.url)[1]


def parse_store_url(url: str) -> tuple[str, str]:
    """s3://BUCKET/PREFIX → (bucket, prefix without slashes); ValueError naming what is wrong."""
    parts = urlparse(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"a store URL is s3://BUCKET/PREFIX, got {url!r}")
    return parts.netloc, parts.path.strip("/")


@dataclass
class TierCounters:
    """What this process saw of the shared tier (the index holds the counters of all workers)."""

    hits: int = 0
    misses: int = 0
    written: int = 0
    dropped: int = 0
    damaged: int = 0
    faults: int = 0
    last_fault: str = ""
    extra: dict[str, int] = field(default_factory=dict)


class SharedTier:
    """get/set/batch_get/batch_set/exists of whole files on S3-compatible storage."""

    def __init__(self, config: SharedConfig) -> None:
        from obstore.store import S3Store  # imported here: a worker without a shared tier never needs it

        self.config = config
        self.bucket, self.prefix = parse_store_url(config.url)
        timeout = f"{max(int(config.timeout_s * 1000), 1)}ms"
        self._s3 = S3Store(
            self.bucket, endpoint=config.endpoint or None, virtual_hosted_style_request=False,
            region="us-east-1" if config.endpoint else None,
            client_options={"allow_http": True, "timeout": timeout, "connect_timeout": timeout,
                            "pool_max_idle_per_host": str(config.threads)},
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=config.timeout_s),
                          "backoff": {"init_backoff": timedelta(milliseconds=50),
                                      "max_backoff": timedelta(milliseconds=500), "base": 2.0}},
        )
        self.counters = TierCounters()
        self._down_until = 0.0
        self._logged = False
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix="kv-shared")
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue(QUEUE_MAX)
        self._writer = threading.Thread(target=self._drain, name="kv-shared-writer", daemon=True)
        self._writer.start()

    def path(self, kind: str, key: str) -> str:
        folder = "blocks" if kind == "block" else "seqs"
        return f"{self.prefix}/{folder}/{key[:2]}/{key}.safetensors".lstrip("/")

    # ---- availability -----------------------------------------------------------------------

    def available(self) -> bool:
        """False for `retry_s` after a fault (the caller counts that as the tier unreachable)."""
        return time.monotonic() >= self._down_until

    def _fault(self, exc: BaseException) -> TierFault:
        text = str(exc)
        reason = "missing bucket" if "NoSuchBucket" in text else "unreachable"
        self.counters.faults += 1
        self.counters.last_fault = reason
        self._down_until = time.monotonic() + self.config.retry_s
        if not self._logged:
            self._logged = True
            log.warning("kv store: the shared tier faulted; runs prefill without it",
                        extra={"bucket": self.bucket, "fault": reason, "reason": text.splitlines()[0][:300]})
        return TierFault(reason, text.splitlines()[0][:300])

    def _ok(self) -> None:
        if self._logged:
            self._logged = False
            log.info("kv store: shared tier reachable again", extra={"bucket": self.bucket})

    # ---- the HiCache-style interface --------------------------------------------------------

    def get(self, path: str) -> bytes | None:
        """The object's bytes, or None when absent. Raises TierFault when the tier cannot answer."""
        import obstore

        if not self.available():
            raise TierFault("unreachable", "down a moment ago; tried again shortly")
        try:
            data = bytes(obstore.get(self._s3, path).bytes())
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise self._fault(exc) from exc
            self._ok()
            return None
        except Exception as exc:  # obstore's errors: connection refused, timeout, 5xx, ...
            raise self._fault(exc) from exc
        self._ok()
        return data

    def batch_get(self, paths: Sequence[str]) -> list[bytes | None]:
        """Many gets at once (the pool); the first fault raises."""
        return list(self._pool.map(self.get, paths))

    def exists(self, paths: Sequence[str]) -> list[bool]:
        return list(self._pool.map(self._head, paths))

    def _head(self, path: str) -> bool:
        import obstore

        try:
            obstore.head(self._s3, path)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._fault(exc) from exc
        return True

    def set(self, path: str, data: bytes) -> None:
        """Write now (the background thread calls this); raises TierFault."""
        import obstore

        try:
            obstore.put(self._s3, path, data)
        except Exception as exc:
            raise self._fault(exc) from exc
        self._ok()

    def batch_set(self, items: Sequence[tuple[str, bytes]]) -> None:
        list(self._pool.map(lambda item: self.set(*item), items))

    def delete(self, path: str) -> None:
        import obstore

        try:
            obstore.delete(self._s3, path)
        except Exception as exc:
            raise self._fault(exc) from exc

    # ---- background writes ------------------------------------------------------------------

    def put_later(self, path: str, data: bytes) -> None:
        """Queue a write; never blocks (a full queue drops it, counted)."""
        try:
            self._queue.put_nowait((path, data))
        except queue.Full:
            self.counters.dropped += 1

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued write is done (or failed); False on timeout."""
        end = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    on_written = None  # set by the store: (path, size) -> None, to record the object in the index

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                path, data = item
                if not self.available():
                    self.counters.dropped += 1
                    continue
                try:
                    self.set(path, data)
                except TierFault:
                    self.counters.dropped += 1
                    continue
                self.counters.written += 1
                if self.on_written is not None:
                    self.on_written(path, len(data))
            except Exception:  # the writer must outlive any bug in a callback
                log.exception("kv store: shared tier writer")
            finally:
                self._queue.task_done()
