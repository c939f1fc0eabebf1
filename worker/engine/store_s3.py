"""The KV store's shared tier: the same content-addressed safetensors files on S3-compatible storage.

`KVStore` (worker.engine.store) keeps its local folder as the near tier and puts this behind it, so a
document prefilled or a skill compiled on one worker is read back by every other (issue 40). The
interface is SGLang HiCache's storage tier: `get`, `set`, `batch_get`, `batch_set`, `exists`.

- Objects are `<prefix>/blocks/ab/<key>.safetensors` and `<prefix>/seqs/ab/<key>.safetensors`, the
  bytes of the local file (checksum in their metadata), keyed by the same SHA-256 chain, so every
  host agrees on a block's name and two workers writing one block write one object.
- The client is obstore: on 500 x 64 KiB objects here it put, headed and got 2-5x as many objects per
  second as boto3 (docs/benchmarks.md, bench/bench_s3_clients.py).
- Writes, and every update of the index, go through one background thread and a queue bounded in
  bytes (`upload_bytes`, KVNOTES_STORE_UPLOAD_BYTES, 512 MiB): a run never waits on the network or on
  Redis. An upload that would pass the bound, or meets the tier down, is dropped: counted, logged at
  most once per `DROP_LOG_S`, and added to the index's `dropped` counter. `flush` waits for the
  queue; `close` drains it (or abandons it, saying how much) and joins the threads.
- Lookups read a chain of blocks the way LMCache's `batched_contains` does: GET the first (a miss
  costs one request, and a missing bucket says so), HEAD the rest in parallel batches, GET in
  parallel what exists (`Shared.lookup`).
- A fault is a miss: every request has a timeout and no retries; an unreachable endpoint, a missing
  bucket or any other error opens the tier's breaker (`vocabulary.breaker.Breaker`; logged once), so
  it is skipped for `retry_s` and then probed once: it comes back without a restart.
- The index (which objects exist, their sizes, last use, shared counters) is in Redis
  (`SharedIndex`, worker.engine.store_tiers): listing 2,000 objects took 147 ms against 16 ms for
  Redis, and a listing knows no last use. The byte budget is enforced by whichever worker finds the
  total over it, evicting least-recently-used objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlparse

from vocabulary.breaker import Breaker

log = logging.getLogger("worker.engine.store")

JOBS_MAX = 65536  # pending background jobs of any kind (index updates weigh 0 bytes); beyond, dropped
DROP_LOG_S = 30.0  # dropped uploads are logged at most this often (with how many since)


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
    upload_bytes: int = 512 * 2**20  # the upload queue's bound in bytes; beyond it an upload is dropped

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
    queued_bytes: int = 0  # the upload queue now
    peak_bytes: int = 0  # the most it held
    extra: dict[str, int] = field(default_factory=dict)


class SharedTier:
    """get/set/batch_get/batch_set/exists of whole files on S3-compatible storage, and the one
    background thread that runs every write and index update (`submit`)."""

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
        self.breaker = Breaker(f"kv shared tier {self.bucket}", config.retry_s)
        self._logged = False
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix="kv-shared")
        self._jobs: deque[tuple[Callable[[], None], int]] = deque()
        self._cond = threading.Condition()
        self._busy = False  # the writer is running a job
        self._closed = False
        self._drops_said = (0.0, 0)  # (when the last drop was logged, dropped then)
        self.on_idle: Callable[[], None] | None = None  # run by the writer between jobs (reports)
        self._writer = threading.Thread(target=self._drain, name="kv-shared-writer", daemon=True)
        self._writer.start()

    def path(self, kind: str, key: str) -> str:
        folder = "blocks" if kind == "block" else "seqs"
        return f"{self.prefix}/{folder}/{key[:2]}/{key}.safetensors".lstrip("/")

    # ---- availability -----------------------------------------------------------------------

    def available(self) -> bool:
        """False while the breaker refuses calls (`retry_s` after a fault; the caller counts that
        as the tier unreachable); True lets this caller through (a probe, when half-open)."""
        return self.breaker.allow()

    def _fault(self, exc: BaseException) -> TierFault:
        text = str(exc)
        reason = "missing bucket" if "NoSuchBucket" in text else "unreachable"
        self.counters.faults += 1
        self.counters.last_fault = reason
        self.breaker.failure()
        if not self._logged:
            self._logged = True
            log.warning("kv store: the shared tier faulted; runs prefill without it",
                        extra={"bucket": self.bucket, "fault": reason, "reason": text.splitlines()[0][:300]})
        return TierFault(reason, text.splitlines()[0][:300])

    def _ok(self) -> None:
        self.breaker.success()
        if self._logged:
            self._logged = False
            log.info("kv store: shared tier reachable again", extra={"bucket": self.bucket})

    def _gate(self) -> None:
        if not self.breaker.allow():
            raise TierFault("unreachable", "down a moment ago; tried again shortly")

    # ---- the HiCache-style interface --------------------------------------------------------

    def get(self, path: str) -> bytes | None:
        """The object's bytes, or None when absent. Raises TierFault when the tier cannot answer."""
        self._gate()
        return self._get(path)

    def _get(self, path: str) -> bytes | None:
        import obstore

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
        self._gate()
        return list(self._pool.map(self._get, paths))

    def exists(self, paths: Sequence[str]) -> list[bool]:
        """HEAD each path at once (the pool); the first fault raises."""
        self._gate()
        return list(self._pool.map(self._head, paths))

    def _head(self, path: str) -> bool:
        import obstore

        try:
            obstore.head(self._s3, path)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._fault(exc) from exc
        self._ok()
        return True

    def chain(self, paths: Sequence[str]) -> list[bytes]:
        """The objects of `paths` up to the first one absent: the first by GET (one request when it
        is absent; a missing bucket says so), the rest HEADed in parallel batches of `threads`
        until one is absent, then what exists fetched in parallel. Raises TierFault."""
        if not paths:
            return []
        first = self.get(paths[0])
        if first is None:
            return []
        present = 1
        batch = self.config.threads
        while present < len(paths):
            found = list(self._pool.map(self._head, paths[present : present + batch]))
            present += found.index(False) if False in found else len(found)
            if False in found:
                break
        rest = list(self._pool.map(self._get, paths[1:present]))
        out = [first]
        for data in rest:
            if data is None:  # deleted between its HEAD and its GET
                break
            out.append(data)
        return out

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

    def count_objects(self) -> tuple[int, int]:
        """(objects, bytes) under the prefix, listed from the bucket (`kvnotes store --verify`);
        raises TierFault."""
        import obstore

        self._gate()
        n = size = 0
        try:
            for batch in obstore.list(self._s3, f"{self.prefix}/" if self.prefix else None):
                n += len(batch)
                size += sum(int(o["size"]) for o in batch)
        except Exception as exc:
            raise self._fault(exc) from exc
        self._ok()
        return n, size

    def is_empty(self) -> bool:
        """Whether the bucket holds no object under the prefix (one short listing); raises TierFault."""
        import obstore

        self._gate()
        try:
            for batch in obstore.list(self._s3, f"{self.prefix}/" if self.prefix else None, chunk_size=1):
                if batch:
                    return False
        except Exception as exc:
            raise self._fault(exc) from exc
        self._ok()
        return True

    # ---- the background thread --------------------------------------------------------------

    def submit(self, job: Callable[[], None], size: int = 0) -> bool:
        """Run `job` on the writer thread; `size` bytes count against the queue's bound. Never blocks:
        past the bound (or after `close`) the job is dropped (an upload counted) and False returned."""
        with self._cond:
            over = size and self.counters.queued_bytes + size > self.config.upload_bytes
            if self._closed or over or len(self._jobs) >= JOBS_MAX:
                if size:
                    self._dropped_upload(size, "closed" if self._closed else "queue full")
                return False
            self._jobs.append((job, size))
            self.counters.queued_bytes += size
            self.counters.peak_bytes = max(self.counters.peak_bytes, self.counters.queued_bytes)
            self._cond.notify()
        return True

    def put_later(self, path: str, data: bytes) -> bool:
        """Queue a write of `data` to `path`; never blocks (past the bound it is dropped, counted)."""
        return self.submit(lambda: self.upload(path, data), len(data))

    def upload(self, path: str, data: bytes) -> bool:
        """Write now, on the writer thread: False (dropped, counted) while the tier is down."""
        if not self.breaker.allow():
            self._dropped_upload(len(data), "tier down")
            return False
        try:
            self.set(path, data)
        except TierFault:
            self._dropped_upload(len(data), "tier down")
            return False
        self.counters.written += 1
        return True

    def _dropped_upload(self, size: int, why: str) -> None:
        self.counters.dropped += 1
        when, said = self._drops_said
        now = time.monotonic()
        if not when or now - when >= DROP_LOG_S:
            self._drops_said = (now, self.counters.dropped)
            log.warning("kv store: shared uploads dropped (the notes stay local; other workers prefill them)",
                        extra={"bucket": self.bucket, "why": why, "dropped": self.counters.dropped - said,
                               "queued_bytes": self.counters.queued_bytes,
                               "bound_bytes": self.config.upload_bytes})

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued job is done (or failed); False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._jobs or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> str:
        """Stop the writer: drain the queue first (up to `timeout_s`), else abandon what is left;
        join the writer and the pool. Says which in the log and returns it ("drained", or
        "abandoned N uploads (B bytes)")."""
        drained = drain and self.flush(timeout_s)
        with self._cond:
            if self._closed and not self._writer.is_alive():
                return "closed"
            left = [size for _, size in self._jobs]
            self._jobs.clear()
            self.counters.queued_bytes = 0
            self._closed = True
            self._cond.notify_all()
        self._writer.join(timeout=self.config.timeout_s + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        uploads = sum(1 for size in left if size)
        if drained or not uploads:
            log.info("kv store: shared uploads drained", extra={"bucket": self.bucket})
            return "drained"
        said = f"abandoned {uploads} uploads ({sum(left)} bytes)"
        self.counters.dropped += uploads
        log.warning("kv store: shared uploads abandoned",
                    extra={"bucket": self.bucket, "uploads": uploads, "bytes": sum(left)})
        return said

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait(1.0)
                    if not self._jobs:
                        break  # a quiet second: report, then wait again
                if self._closed and not self._jobs:
                    return
                job = self._jobs.popleft() if self._jobs else None
                self._busy = job is not None
            try:
                if job is not None:
                    job[0]()
                if self.on_idle is not None:
                    self.on_idle()
            except Exception:  # the writer must outlive any bug in a job
                log.exception("kv store: shared tier writer")
            finally:
                with self._cond:
                    if job is not None:
                        self.counters.queued_bytes -= job[1]
                    self._busy = False
                    self._cond.notify_all()
