"""What the gateway counts, per base and in total, kept in its state (`serving.gateway.state`: this
process's memory, or the Redis every process shares), and how it shows them: `/metrics` from
`prometheus_client` (a collector that reads the state at each scrape, so every process and replica
reports the same exact numbers) and the typed rows of the Gateway page.

Per base (its counts live and die with it): requests, rewrites, pass-throughs, prompt tokens and
prefix tokens reused (as the engine reports them in `usage.prompt_tokens_details.cached_tokens`),
times to first token of rewritten and passed-through streamed requests, the sampled checks (agreed /
sent, with their Wilson interval, `vocabulary.sweeps.wilson`), the prompt tokens the checks sent, and
why it was switched to pass-through. In total the same, never dropped. A base is named by a short id,
never by its text; a pass-through's reason is a label from a closed set (`reason_kind`), and only the
`BASE_SERIES` most recently used bases have series in `/metrics`.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from serving.gateway.state import TOTALS, Limits, MemoryState, State
from serving.replay import percentile
from vocabulary.sweeps import wilson

log = logging.getLogger("kvnotes.gateway")
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
KEEP_TTFTS = 500  # the latest times kept per base and kind, for the page's percentiles
BASE_SERIES = 16  # the most recently used bases with series of their own in /metrics
PAGE_ROWS = 100  # the most recently used bases the page lists
KINDS = ("rewritten", "pass_through")
# a pass-through's reason -> its label (the first whose words are in the reason); else "other"
REASON_KINDS = (("new base", "new_base"), ("context under", "short_context"), ("no tenant", "no_tenant"),
                ("shared state", "state_unreachable"), ("sampled agreement", "disagreed"),
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
    """The counts in `state`; a write the state refuses is logged and dropped (it never fails a
    request), and counted in this process (`state_errors`)."""

    def __init__(self, state: State | None = None) -> None:
        self.state = state or MemoryState(Limits())
        self.state_errors = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def _safely(self, write, *args) -> object:
        if self.state.down:
            self.state_errors += 1
            return {}
        try:
            return write(*args)
        except self.state.errors as exc:
            self.state_errors += 1
            self.state.failed()
            log.warning("gateway state unreachable: a count is lost", extra={"error": str(exc)[:200]})
            return {}

    def request(self, base_id: str | None, reason: str) -> None:
        """Count one request: rewritten (`reason` "") or passed through for `reason`."""
        name = "rewrites" if not reason else f"pass:{reason_kind(reason)}"
        self._safely(self.state.add, TOTALS, {"requests": 1, name: 1})
        if base_id is not None:
            self._safely(self.state.add, base_id, {"requests": 1, "rewrites" if not reason else "passes": 1})

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
        kind = KINDS[0] if rewritten else KINDS[1]
        counts: dict[str, float] = {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}
        if ttft_ms is not None:
            seconds = ttft_ms / 1000
            slot = next((i for i, b in enumerate(TTFT_BUCKETS_S) if seconds <= b), len(TTFT_BUCKETS_S))
            counts.update({f"ttft:{kind}:{slot}": 1, f"ttft_sum:{kind}": float(seconds)})
        self._safely(self.state.add, TOTALS, counts)
        if base_id:
            self._safely(self.state.add, base_id, {"prompt_tokens": prompt_tokens,
                                                   "cached_tokens": cached_tokens})
            if ttft_ms is not None:
                self._safely(self.state.push, f"ttft:{base_id}:{kind}", ttft_ms, KEEP_TTFTS)

    def checked(self, base_id: str, agreed: bool, prompt_tokens: int, threshold: float) -> str:
        """Count one sampled check (and the prompt tokens it sent); the reason the base now passes
        through ("" while it does not). A base switches once a check disagreed and the lower bound
        of its agreement is under `threshold`; the first process to switch it writes why."""
        self._safely(self.state.add, TOTALS, {"check_requests": 1, "check_prompt_tokens": prompt_tokens,
                                              "agreed" if agreed else "disagreed": 1})
        now = self._safely(self.state.add, base_id, {"checks": 1, "agreed": int(agreed),
                                                     "check_prompt_tokens": prompt_tokens})
        if not now:
            return ""
        checks, agreed_n = int(now["checks"]), int(now["agreed"])
        low = wilson(agreed_n, checks)[0]
        if agreed_n < checks and low < threshold:
            why = f"sampled agreement {agreed_n}/{checks}, lower bound {low:.2f} under {threshold:g}"
            return str(self._safely(self.state.put, base_id, "switched", why, True) or why)
        return str((self._safely(self.state.read, base_id) or [{}])[0].get("switched", ""))

    # --- reading -------------------------------------------------------------------------------------

    def rows(self, n: int = PAGE_ROWS) -> list[BaseRow]:
        """The `n` most recently used bases."""
        ids = self.state.recent(n)
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


class _Collector:
    """Reads the state at each scrape: the totals, then the `BASE_SERIES` most recent bases, each
    metric family once."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self):
        state = self.stats.state
        up = GaugeMetricFamily("kvnotes_gateway_state_up", "1 when the gateway's state answered this scrape.")
        errors = CounterMetricFamily("kvnotes_gateway_state_errors", "Counts this process could not write "
                                     "to the state (it was unreachable).", value=self.stats.state_errors)
        try:
            t = state.read(TOTALS)[0]
            tenants, bases = state.sizes()
            ids = state.recent(BASE_SERIES)
            per_base = list(zip(ids, state.read(*ids)))
        except state.errors:
            up.add_metric([], 0)
            yield from (up, errors)
            return
        up.add_metric([], 1)
        yield from (up, errors)
        yield from _totals(t, tenants, bases)
        yield from _per_base(per_base)


def _counter(name: str, doc: str, value: float | None = None, labels: list[str] | None = None):
    return CounterMetricFamily(f"kvnotes_gateway_{name}", doc, value=value, labels=labels)


def _totals(t: dict[str, str], tenants: int, bases: int):
    number = lambda name: float(t.get(name) or 0)  # noqa: E731
    yield _counter("requests", "Requests the gateway answered.", number("requests"))
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
    yield GaugeMetricFamily("kvnotes_gateway_tenants", "Tenants with bases held.", value=tenants)
    yield GaugeMetricFamily("kvnotes_gateway_bases", "Bases held, all tenants.", value=bases)


def _per_base(per_base: list[tuple[str, dict[str, str]]]):
    families = {name: _counter(f"base_{name}", doc, labels=["base"]) for name, doc in (
        ("requests", "Requests of one base."), ("rewrites", "Rewritten requests of one base."),
        ("prompt_tokens", "Prompt tokens of one base's requests."),
        ("prefix_tokens_reused", "Prefix tokens reused by one base's requests."))}
    checks = _counter("base_checks", "One base's sampled checks by outcome.", labels=["base", "agreed"])
    agreement = GaugeMetricFamily("kvnotes_gateway_base_agreement", "One base's sampled agreement.",
                                  labels=["base"])
    switched = GaugeMetricFamily("kvnotes_gateway_base_pass_through", "1 when a base was switched to "
                                 "pass-through.", labels=["base"])
    for base_id, v in per_base:
        values = Counter({"requests": _int(v, "requests"), "rewrites": _int(v, "rewrites"),
                          "prompt_tokens": _int(v, "prompt_tokens"),
                          "prefix_tokens_reused": _int(v, "cached_tokens")})
        for name, family in families.items():
            family.add_metric([base_id], values[name])
        n, agreed = _int(v, "checks"), _int(v, "agreed")
        checks.add_metric([base_id, "true"], agreed)
        checks.add_metric([base_id, "false"], n - agreed)
        if n:
            agreement.add_metric([base_id], round(agreed / n, 4))
        switched.add_metric([base_id], int(bool(v.get("switched"))))
    yield from (*families.values(), checks, agreement, switched)
