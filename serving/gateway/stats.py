"""What the gateway counts, and how it shows it: `/metrics` from `prometheus_client` (this process's
own counters, which Prometheus sums over processes and replicas), and the typed rows and totals of
the Gateway page (read from the state, `serving.gateway.state`: the cluster's numbers).

**Never on the event loop.** `request` and `answered` (the event loop calls `answered` when an answer
ends) add to this process's counters and to a buffer in memory, nothing else; one flusher thread
writes the buffer to the state every `FLUSH_S` in one pipeline (LiteLLM's dual cache does the same).
While the state's breaker is open the buffer waits (bounded: `PENDING_KEYS` keys; the counts of a key
past it are dropped and counted, `counts_dropped`). A check's verdict (`checked`) and a plan's reads
(`switched`, `labels`) run on the planner threads and ask the state directly.

Per base (its counts live and die with it): requests, rewrites, pass-throughs, prompt tokens and
prefix tokens reused (as the engine reports them in `usage.prompt_tokens_details.cached_tokens`),
times to first token of rewritten and passed-through streamed requests, the sampled checks (agreed /
sent, with their Wilson interval, `vocabulary.sweeps.wilson`), the prompt tokens the checks sent, and
why it was switched to pass-through: on the page, never in `/metrics` (per-base series would come and
go between scrapes). In total the same, never dropped. A base is named by a short id, never by its
text; a pass-through's reason is a label from a closed set (`reason_kind`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from serving.gateway.memory_state import MemoryState
from serving.gateway.state import TOTALS, Limits, State
from serving.replay import percentile
from vocabulary.sweeps import wilson

log = logging.getLogger("kvnotes.gateway")
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
KEEP_TTFTS = 500  # the latest times kept per base and kind, for the page's percentiles
FLUSH_S = 0.5  # the flusher writes the buffered counts this often
PENDING_KEYS = 10_000  # keys buffered at most while the state is unreachable
LOG_EVERY_S = 30.0  # a state that stays unreachable is logged this often by the flusher
PAGE_ROWS = 100  # the most recently used bases the page lists
KINDS = ("rewritten", "pass_through")
# a pass-through's reason -> its label (the first whose words are in the reason); else "other"
REASON_KINDS = (("new base", "new_base"), ("context under", "short_context"), ("no tenant", "no_tenant"),
                ("shared state", "state_unreachable"),
                ("lock is busy", "lock_busy"), ("still being planned", "tenant_busy"),
                ("sampled agreement", "disagreed"),
                ("passes through", "policy"), ("plan failed", "plan_failed"),
                ("notebook's document", "not_in_template"), ("earlier erratum", "turn_missing"),
                ("over --max-fields", "max_fields"), ("changes cover", "max_share"),
                ("no context", "unreadable"), ("not plain text", "unreadable"),
                ("not one text", "unreadable"))
REASONS = tuple(dict.fromkeys(kind for _, kind in REASON_KINDS)) + ("other",)


def reason_kind(reason: str) -> str:
    """The closed-set label of a pass-through's reason (reasons carry numbers; labels must not)."""
    return next((kind for words, kind in REASON_KINDS if words in reason), "other")


@dataclass(frozen=True)
class BaseRow:
    """One base as the Gateway page shows it."""

    base_id: str
    labels: tuple[str, ...]
    requests: int
    rewrites: int
    pass_throughs: int
    hit_rate: float | None
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    pass_p50_ms: float | None
    pass_p90_ms: float | None
    checks: int
    agreed: int
    low: float | None
    high: float | None
    switched: str


@dataclass(frozen=True)
class Totals:
    """The totals the page shows: requests, rewrites, pass-throughs by reason label, the prompt
    tokens sent for clients and for checks, the bases and tenants held, and the state's name."""

    requests: int
    rewrites: int
    reasons: dict[str, int]
    prompt_tokens: int
    cached_tokens: int
    check_requests: int
    check_prompt_tokens: int
    tenants: int
    bases: int
    state: str
    problem: str = ""


def _int(values: dict[str, str], name: str) -> int:
    return int(float(values.get(name) or 0))


class Stats:
    """This process's counters (`local`), and the counts buffered for the state and written by one
    flusher thread (`flush`); a write the state refuses is logged and kept for the next flush (it
    never fails a request), and counted in this process (`state_errors`)."""

    def __init__(self, state: State | None = None, flush_s: float = FLUSH_S) -> None:
        self.state = state or MemoryState(Limits())
        self.flush_s = flush_s
        self.local: Counter = Counter()  # this process's own: /metrics
        self._pending: defaultdict[str, Counter] = defaultdict(Counter)
        self._samples: defaultdict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time (held across the state's round trip)
        self._starting = threading.Lock()  # the flusher's start and stop (never held across Redis)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged = 0.0
        self.held = (0, 0)  # (tenants, bases) as the state last said (the flusher refreshes it)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    @property
    def state_errors(self) -> int:
        return int(self.local["state_errors"])

    def count_local(self, name: str, n: float = 1) -> None:
        """Count one of this process's own events (`saves_fenced`, `checks_skipped`, ...)."""
        with self._lock:
            self.local[name] += n

    def _safely(self, write, *args) -> object:
        """`write(*args)` to the state through its breaker; {} when it is open or the call fails."""
        breaker = self.state.breaker
        if not breaker.allow():
            self.count_local("state_errors")
            return {}
        try:
            out = write(*args)
        except self.state.errors as exc:
            self.count_local("state_errors")
            breaker.failure()
            log.warning("gateway state unreachable: a count is lost", extra={"error": str(exc)[:200]})
            return {}
        breaker.success()
        return out

    # --- counting (any thread, the event loop included: memory only) ---------------------------------

    def _buffer(self, totals: dict[str, float], base_id: str | None = None,
                per_base: dict[str, float] | None = None, sample: tuple[str, float] | None = None) -> None:
        with self._lock:
            self.local.update(totals)
            for key, counts in ((TOTALS, totals), (base_id, per_base)):
                if key is None or not counts:
                    continue
                if key not in self._pending and len(self._pending) >= PENDING_KEYS:
                    self.local["counts_dropped"] += 1
                    continue
                self._pending[key].update(counts)
            if sample is not None and len(self._samples[sample[0]]) < KEEP_TTFTS:
                self._samples[sample[0]].append(sample[1])
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._starting:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="gateway-stats", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def flush(self) -> bool:
        """Write the buffered counts to the state in one round trip, and read its sizes; False (the
        counts kept for the next flush) when the state is unreachable."""
        with self._flushing:
            with self._lock:
                pending, samples = dict(self._pending), dict(self._samples)
                self._pending, self._samples = defaultdict(Counter), defaultdict(list)
            breaker = self.state.breaker
            try:
                if not breaker.allow():
                    raise _Skipped
                self.state.add_many({k: dict(v) for k, v in pending.items()}, samples, KEEP_TTFTS)
                self.held = self.state.sizes()
            except (_Skipped, *self.state.errors) as exc:
                if not isinstance(exc, _Skipped):
                    breaker.failure()
                    self.count_local("state_errors")
                    if time.monotonic() - self._logged > LOG_EVERY_S:
                        self._logged = time.monotonic()
                        log.warning("gateway state unreachable: counts wait in memory",
                                    extra={"error": str(exc)[:200]})
                with self._lock:  # back in front of what came since
                    for key, counts in pending.items():
                        if key in self._pending or len(self._pending) < PENDING_KEYS:
                            self._pending[key].update(counts)
                        else:
                            self.local["counts_dropped"] += 1
                    for key, values in samples.items():
                        self._samples[key] = (values + self._samples[key])[-KEEP_TTFTS:]
                return False
            breaker.success()
            return True

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Stop the flusher, after one last flush."""
        self._stop.set()
        with self._starting:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        self.flush()

    def request(self, base_id: str | None, reason: str) -> None:
        """Count one request: rewritten (`reason` "") or passed through for `reason`."""
        name = "rewrites" if not reason else f"pass:{reason_kind(reason)}"
        self._buffer({"requests": 1, name: 1}, base_id,
                     {"requests": 1, "rewrites" if not reason else "passes": 1})

    def labels(self, base_id: str, labels: tuple[str, ...]) -> None:
        """Remember the fields a base's rewrites changed (under its tenant's lock)."""
        known = self._safely(self.state.read, base_id) or [{}]
        seen = set(filter(None, known[0].get("labels", "").split("\x1f")))
        if not set(labels) <= seen:
            self._safely(self.state.put, base_id, "labels", "\x1f".join(sorted(seen | set(labels))))

    def switched(self, base_id: str) -> str:
        """Why the base passes through now ("" while it is rewritten)."""
        return self.state.read(base_id)[0].get("switched", "")

    def answered(self, base_id: str | None, rewritten: bool, ttft_ms: float | None, prompt_tokens: int,
                 cached_tokens: int) -> None:
        """Count one answered request (memory only: the event loop calls it)."""
        kind = KINDS[0] if rewritten else KINDS[1]
        counts: dict[str, float] = {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}
        if ttft_ms is not None:
            seconds = ttft_ms / 1000
            slot = next((i for i, b in enumerate(TTFT_BUCKETS_S) if seconds <= b), len(TTFT_BUCKETS_S))
            counts.update({f"ttft:{kind}:{slot}": 1, f"ttft_sum:{kind}": float(seconds)})
        sample = (f"ttft:{base_id}:{kind}", ttft_ms) if base_id and ttft_ms is not None else None
        self._buffer(counts, base_id or None,
                     {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}, sample)

    def checked(self, base_id: str, agreed: bool, prompt_tokens: int, threshold: float) -> str:
        """Count one sampled check (and the prompt tokens it sent); the reason the base now passes
        through ("" while it does not). A base switches once a check disagreed and the lower bound
        of its agreement is under `threshold`; the first process to switch it writes why."""
        self._buffer({"check_requests": 1, "check_prompt_tokens": prompt_tokens,
                      "agreed" if agreed else "disagreed": 1})
        now = self._safely(self.state.add, base_id, {"checks": 1, "agreed": int(agreed),
                                                     "check_prompt_tokens": prompt_tokens})
        if not now:
            return ""
        checks, agreed_n = int(now["checks"]), int(now["agreed"])
        low = wilson(agreed_n, checks)[0]
        if agreed_n < checks and low < threshold:
            why = f"sampled agreement {agreed_n}/{checks}, lower bound {low:.2f} under {threshold:g}"
            said = str(self._safely(self.state.put, base_id, "switched", why, True) or why)
            if said == why:
                self.count_local("switched")
            return said
        return str((self._safely(self.state.read, base_id) or [{}])[0].get("switched", ""))

    # --- reading -------------------------------------------------------------------------------------

    def rows(self, n: int = PAGE_ROWS, tenant: str | None = None) -> list[BaseRow]:
        """The `n` most recently used bases (this process's buffered counts written first): of
        `tenant` only when given (a user's page: the labels are text from prompts, so only the
        tenant's own are shown to it), else of every tenant."""
        self.flush()
        if tenant is None:
            ids = self.state.recent(n)
        else:
            owned = sorted(self.state.index(tenant), key=lambda info: info.used, reverse=True)
            ids = [info.base_id for info in owned[:n]]
        return [self._row(b, values) for b, values in zip(ids, self.state.read(*ids))]

    def _row(self, base_id: str, v: dict[str, str]) -> BaseRow:
        rewritten, passed = (self.state.samples(f"ttft:{base_id}:{k}") for k in KINDS)
        checks, agreed, prompt = _int(v, "checks"), _int(v, "agreed"), _int(v, "prompt_tokens")
        low, high = wilson(agreed, checks) if checks else (None, None)
        return BaseRow(base_id, tuple(sorted(filter(None, v.get("labels", "").split("\x1f")))),
                       _int(v, "requests"), _int(v, "rewrites"), _int(v, "passes"),
                       round(_int(v, "cached_tokens") / prompt, 4) if prompt else None,
                       _pct(rewritten, 50), _pct(rewritten, 90), _pct(passed, 50), _pct(passed, 90),
                       checks, agreed, None if low is None else round(low, 4),
                       None if high is None else round(high, 4), v.get("switched", ""))

    def totals(self) -> Totals:
        """The cluster's totals, from the state (this process's buffered counts written first)."""
        self.flush()
        try:
            t = self.state.read(TOTALS)[0]
            tenants, bases = self.state.sizes()
        except self.state.errors as exc:
            return Totals(0, 0, {}, 0, 0, 0, 0, 0, 0, self.state.name, f"the state is unreachable: {exc}")
        reasons = {k: _int(t, f"pass:{k}") for k in REASONS if _int(t, f"pass:{k}")}
        return Totals(_int(t, "requests"), _int(t, "rewrites"), reasons, _int(t, "prompt_tokens"),
                      _int(t, "cached_tokens"), _int(t, "check_requests"), _int(t, "check_prompt_tokens"),
                      tenants, bases, self.state.name)

    def prometheus(self) -> bytes:
        """The Prometheus text exposition (prometheus_client's)."""
        return generate_latest(self.registry)


def _pct(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


class _Skipped(Exception):
    """The breaker is open: a flush is not tried."""


class _Collector:
    """This process's counters at each scrape (nothing is read from the state: a scrape never waits
    on Redis), each metric family once, the same series at every scrape."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self):
        stats = self.stats
        with stats._lock:
            local = Counter(stats.local)
            pending = len(stats._pending)
        up = GaugeMetricFamily("kvnotes_gateway_state_up", "1 while the gateway's state answers (its "
                               "breaker is closed).", value=0 if stats.state.breaker.down else 1)
        yield up
        for name, doc in (("state_errors", "Calls of this process to the state that failed or were not "
                           "tried (its breaker open)."),
                          ("counts_dropped", "Counts this process dropped: its buffer was full while the "
                           "state was unreachable."),
                          ("saves_fenced", "Plans whose save was refused: the tenant's lock was lost."),
                          ("checks_skipped", "Checks drawn while the most were already waiting."),
                          ("switched", "Bases this process switched to pass-through (sampled agreement)."
                           )):
            yield _counter(name, doc, local[name])
        yield GaugeMetricFamily("kvnotes_gateway_counts_pending", "Keys of counts buffered for the "
                                "state (written every flush).", value=pending)
        yield from _totals(local, *stats.held)


def _counter(name: str, doc: str, value: float | None = None, labels: list[str] | None = None):
    return CounterMetricFamily(f"kvnotes_gateway_{name}", doc, value=value, labels=labels)


def _totals(t: Counter, tenants: int, bases: int):
    number = lambda name: float(t.get(name) or 0)  # noqa: E731
    yield _counter("requests", "Requests this process answered.", number("requests"))
    yield _counter("rewrites", "Requests sent as their base plus errata (or hoisted).", number("rewrites"))
    passes = _counter("pass_through", "Requests sent unchanged, by reason.", labels=["reason"])
    for kind in REASONS:
        passes.add_metric([kind], number(f"pass:{kind}"))
    yield passes
    yield _counter("prompt_tokens", "Prompt tokens the engine reported for clients' requests.",
                   number("prompt_tokens"))
    yield _counter("prefix_tokens_reused", "Prompt tokens the engine took from its prefix cache, as it "
                   "reports them.", number("cached_tokens"))
    yield _counter("check_requests", "Sampled checks: rewritten requests also sent unchanged.",
                   number("check_requests"))
    yield _counter("check_prompt_tokens", "Prompt tokens the engine reported for the sampled checks "
                   "(their cost, beside kvnotes_gateway_prompt_tokens_total).", number("check_prompt_tokens"))
    checks = _counter("checks", "Sampled checks by outcome.", labels=["agreed"])
    checks.add_metric(["true"], number("agreed"))
    checks.add_metric(["false"], number("disagreed"))
    yield checks
    ttft = HistogramMetricFamily("kvnotes_gateway_ttft_seconds", "Time to first token of streamed requests.",
                                 labels=["sent"])
    for kind in KINDS:
        total, buckets = 0.0, []
        for i, bound in enumerate([*map(str, TTFT_BUCKETS_S), "+Inf"]):
            total += number(f"ttft:{kind}:{i}")
            buckets.append((bound, total))
        ttft.add_metric([kind], buckets, number(f"ttft_sum:{kind}"))
    yield ttft
    yield GaugeMetricFamily("kvnotes_gateway_tenants", "Tenants with bases held in the state (the "
                            "state's, the same in every process: take max(), not sum()).", value=tenants)
    yield GaugeMetricFamily("kvnotes_gateway_bases", "Bases held in the state, all tenants (the state's: "
                            "max(), not sum()).", value=bases)
