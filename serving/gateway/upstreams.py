"""The gateway's upstreams: one or more replicas of the serving engine (`kvnotes gateway --upstream URL`,
repeatable), each behind one circuit breaker (`vocabulary.breaker.Breaker`) and health-checked.

- **Health.** A thread reads each upstream's `/metrics` every `HEALTH_S` (the engine's queue: vLLM's
  `vllm:num_requests_waiting` + `vllm:num_requests_running`, SGLang's `sglang:num_queue_reqs` +
  `sglang:num_running_reqs`). One that cannot be reached, or a request to it that could not connect,
  opens its breaker: it is out of rotation for `RETRY_S`; then the health check probes it (half-open)
  and a probe that answers closes the breaker. While every upstream is out, requests still go to
  the one chosen (its error is the client's answer: there is nowhere else).
- **Load.** An upstream's load is the larger of the queue it reported at its last health check and
  the requests this process has in flight to it (exact for this process, and seen at once).
- **Counts**, per process (a Prometheus counter per upstream, summed over processes by PromQL):
  requests, prompt tokens, prefix tokens reused (as the engine reports them) and so prefill tokens
  sent and hit rate, failures; and whether it is in rotation. `/metrics` and the Gateway page show them.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from serving.backend import EngineBackend
from serving.server import ReplayError
from vocabulary.breaker import Breaker

log = logging.getLogger("kvnotes.gateway")
HEALTH_S = 2.0  # seconds between two health checks of an upstream
RETRY_S = 10.0  # an upstream that failed is out of rotation this long, then probed
HEALTH_TIMEOUT_S = 5.0  # a health check's (and a tokenize's) bound: connect and answer


@dataclass(frozen=True)
class UpstreamRow:
    """One upstream as the page and /metrics show it (this process's counts)."""

    name: str
    in_rotation: bool
    state: str
    load: float
    requests: int
    prompt_tokens: int
    cached_tokens: int
    failures: int

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float | None:
        return round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None


class Upstream:
    """One replica: its backend (requests), a second one with short bounds (health checks), its
    breaker and this process's counts."""

    def __init__(self, backend: EngineBackend, probe: EngineBackend, retry_s: float = RETRY_S) -> None:
        self.backend = backend
        self.probe = probe
        self.name = backend.url
        self.breaker = Breaker(f"upstream {self.name}", retry_s)
        self.inflight = 0
        self.reported = 0.0  # the queue its /metrics showed at the last health check
        self.requests = self.prompt_tokens = self.cached_tokens = 0
        self._lock = threading.Lock()

    @property
    def in_rotation(self) -> bool:
        return self.breaker.state == "closed"

    @property
    def load(self) -> float:
        return max(self.reported, float(self.inflight))

    def started(self) -> None:
        with self._lock:
            self.inflight += 1

    def ended(self, prompt_tokens: int = 0, cached_tokens: int = 0, answered: bool = False) -> None:
        with self._lock:
            self.inflight = max(0, self.inflight - 1)
            if answered:
                self.requests += 1
                self.prompt_tokens += prompt_tokens
                self.cached_tokens += cached_tokens

    def check(self) -> None:
        """One health check (the health thread): the queue read, the breaker told."""
        if self.breaker.state == "open":
            return  # out for its back-off; probed once it is half-open
        try:
            queue = self.probe.queue()
        except ReplayError as exc:
            if self.breaker.state == "closed":
                log.warning("gateway upstream out of rotation", extra={"upstream": self.name,
                                                                        "error": str(exc)[:200]})
            self.breaker.failure()
            return
        if self.breaker.state != "closed":
            log.info("gateway upstream back in rotation", extra={"upstream": self.name})
        self.breaker.success()
        self.reported = queue or 0.0

    def row(self) -> UpstreamRow:
        return UpstreamRow(self.name, self.in_rotation, self.breaker.state, self.load, self.requests,
                           self.prompt_tokens, self.cached_tokens, self.breaker.failures)


class Pool:
    """The upstreams (in the order given), their health thread, and the choices that need no state:
    the least loaded (ties go round-robin, so first requests spread) and plain round-robin."""

    def __init__(self, upstreams: Sequence[Upstream], health_s: float = HEALTH_S) -> None:
        if not upstreams:
            raise ValueError("the gateway needs at least one upstream")
        self.upstreams = list(upstreams)
        self.health_s = health_s
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self.upstreams)

    def named(self, name: str | None) -> Upstream | None:
        return next((u for u in self.upstreams if u.name == name), None)

    def in_rotation(self, exclude: Sequence[Upstream] = ()) -> list[Upstream]:
        """The upstreams in rotation (all but `exclude`); none in rotation: all but `exclude`."""
        left = [u for u in self.upstreams if u not in exclude]
        return [u for u in left if u.in_rotation] or left

    def least_loaded(self, exclude: Sequence[Upstream] = ()) -> Upstream | None:
        candidates = self.in_rotation(exclude)
        if not candidates:
            return None
        low = min(u.load for u in candidates)
        tied = [u for u in candidates if u.load == low]
        return tied[next(self._turn) % len(tied)]

    def round_robin(self) -> Upstream:
        candidates = self.in_rotation()
        return candidates[next(self._turn) % len(candidates)]

    # --- health --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the health thread (once; not for one upstream alone: it has nowhere else to go)."""
        if self._thread is None and len(self.upstreams) > 1:
            self._thread = threading.Thread(target=self._watch, name="gateway-health", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for upstream in self.upstreams:
                try:
                    upstream.check()
                except Exception:  # a bug must not end the health checks
                    log.exception("gateway health check failed", extra={"upstream": upstream.name})
            self._stop.wait(self.health_s)

    def close(self) -> None:
        self._stop.set()
        for upstream in self.upstreams:
            upstream.probe.close()

    def rows(self) -> list[UpstreamRow]:
        return [u.row() for u in self.upstreams]

    def collect(self):
        """The per-upstream families for /metrics (this process's counts)."""
        def family(name: str, doc: str, kind=CounterMetricFamily):
            return kind(f"kvnotes_gateway_upstream_{name}", doc, labels=["upstream"])

        families = [
            (family("requests", "Requests this process sent to one upstream and it answered."), "requests"),
            (family("prompt_tokens", "Prompt tokens one upstream reported for them."), "prompt_tokens"),
            (family("prefix_tokens_reused", "Of those, the tokens it took from its prefix cache."),
             "cached_tokens"),
            (family("prefill_tokens", "Prompt tokens it prefilled (prompt less reused)."), "prefill_tokens"),
            (family("failures", "Health checks and requests that could not reach it."), "failures"),
            (family("up", "1 while the upstream is in rotation.", GaugeMetricFamily), "in_rotation"),
            (family("load", "Its queue (reported, or in flight from this process).", GaugeMetricFamily),
             "load"),
        ]
        rows = self.rows()
        for f, attr in families:
            for row in rows:
                f.add_metric([row.name], float(getattr(row, attr)))
            yield f
        hit = family("hit_rate", "Its prefix-cache hit rate on this process's requests.", GaugeMetricFamily)
        for row in rows:
            if row.hit_rate is not None:
                hit.add_metric([row.name], row.hit_rate)
        yield hit
