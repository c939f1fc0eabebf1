"""What the gateway counts, per base and in total, and how it shows them: the Prometheus text of
`/metrics` and the typed rows of the Gateway page.

Per base: requests, rewrites, pass-throughs by reason, prompt tokens and prefix tokens reused (as
the engine reports them in `usage.prompt_tokens_details.cached_tokens`), times to first token of
rewritten and of passed-through streamed requests, and the sampled checks (agreed / sent) with their
Wilson interval (`vocabulary.sweeps.wilson`). A base is named by a short id, never by its text.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from serving.replay import percentile
from vocabulary.sweeps import wilson

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
KEEP_TTFTS = 2000  # the latest times kept per base and kind, for the page's percentiles


@dataclass
class BaseStats:
    """One base's running counts (see the module docstring)."""

    base_id: str
    requests: int = 0
    rewrites: int = 0
    pass_throughs: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: dict[str, list[float]] = field(default_factory=lambda: {"rewritten": [], "pass_through": []})
    checks: int = 0
    agreed: int = 0
    labels: set[str] = field(default_factory=set)
    switched: str = ""  # why this base now passes through ("" while it is rewritten)

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson(self.agreed, self.checks) if self.checks else None

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


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


class Stats:
    """Every base's counts and the totals; thread-safe (the checks report from the background)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bases: dict[str, BaseStats] = {}
        self.reasons: Counter = Counter()
        self.requests = 0
        self.histogram: dict[str, list[int]] = {k: [0] * (len(TTFT_BUCKETS_S) + 1)
                                               for k in ("rewritten", "pass_through")}
        self.ttft_sum: dict[str, float] = {"rewritten": 0.0, "pass_through": 0.0}

    def base(self, base_id: str) -> BaseStats:
        with self.lock:
            return self.bases.setdefault(base_id, BaseStats(base_id))

    def request(self, base_id: str | None, reason: str) -> None:
        """Count one request: rewritten (`reason` "") or passed through for `reason`."""
        with self.lock:
            self.requests += 1
            if reason:
                self.reasons[reason] += 1
            if base_id is None:
                return
            stats = self.bases.setdefault(base_id, BaseStats(base_id))
            stats.requests += 1
            if reason:
                stats.pass_throughs[reason] += 1
            else:
                stats.rewrites += 1

    def answered(self, base_id: str | None, rewritten: bool, ttft_ms: float | None, prompt_tokens: int,
                 cached_tokens: int) -> None:
        kind = "rewritten" if rewritten else "pass_through"
        with self.lock:
            if ttft_ms is not None:
                seconds = ttft_ms / 1000
                slot = next((i for i, b in enumerate(TTFT_BUCKETS_S) if seconds <= b), len(TTFT_BUCKETS_S))
                self.histogram[kind][slot] += 1
                self.ttft_sum[kind] += seconds
            stats = self.bases.get(base_id) if base_id else None
            if stats is None:
                return
            stats.prompt_tokens += prompt_tokens
            stats.cached_tokens += cached_tokens
            if ttft_ms is not None:
                stats.ttft_ms[kind] = (stats.ttft_ms[kind] + [ttft_ms])[-KEEP_TTFTS:]

    def rows(self) -> list[BaseRow]:
        with self.lock:
            return [_row(s) for s in self.bases.values()]

    def prometheus(self) -> str:
        """The Prometheus text exposition of every series."""
        with self.lock:
            return _exposition(self)


def _pct(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


def _row(s: BaseStats) -> BaseRow:
    low, high = s.interval or (None, None)
    return BaseRow(s.base_id, tuple(sorted(s.labels)), s.requests, s.rewrites, sum(s.pass_throughs.values()),
                   None if s.hit_rate is None else round(s.hit_rate, 4),
                   _pct(s.ttft_ms["rewritten"], 50), _pct(s.ttft_ms["rewritten"], 90),
                   _pct(s.ttft_ms["pass_through"], 50), _pct(s.ttft_ms["pass_through"], 90),
                   s.checks, s.agreed, None if low is None else round(low, 4),
                   None if high is None else round(high, 4), s.switched)


def _line(name: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _exposition(stats: Stats) -> str:
    bases = list(stats.bases.values())
    out = ["# HELP kvnotes_gateway_requests_total Requests the gateway answered.",
           "# TYPE kvnotes_gateway_requests_total counter",
           _line("kvnotes_gateway_requests_total", {}, stats.requests)]
    out += [_line("kvnotes_gateway_requests_total", {"base": b.base_id}, b.requests) for b in bases]
    out += ["# HELP kvnotes_gateway_rewrites_total Requests sent as their base plus errata (or hoisted).",
            "# TYPE kvnotes_gateway_rewrites_total counter",
            _line("kvnotes_gateway_rewrites_total", {}, sum(b.rewrites for b in bases))]
    out += [_line("kvnotes_gateway_rewrites_total", {"base": b.base_id}, b.rewrites) for b in bases]
    out += ["# HELP kvnotes_gateway_pass_through_total Requests sent unchanged, by reason.",
            "# TYPE kvnotes_gateway_pass_through_total counter"]
    out += [_line("kvnotes_gateway_pass_through_total", {"reason": r}, n)
            for r, n in sorted(stats.reasons.items())]
    out += [_line("kvnotes_gateway_pass_through_total", {"base": b.base_id, "reason": r}, n)
            for b in bases for r, n in sorted(b.pass_throughs.items())]
    for name, attr, what in (("prompt_tokens", "prompt_tokens", "Prompt tokens the engine reported."),
                             ("prefix_tokens_reused", "cached_tokens",
                              "Prompt tokens the engine took from its prefix cache, as it reports them.")):
        metric = f"kvnotes_gateway_{name}_total"
        out += [f"# HELP {metric} {what}", f"# TYPE {metric} counter",
                _line(metric, {}, sum(getattr(b, attr) for b in bases))]
        out += [_line(metric, {"base": b.base_id}, getattr(b, attr)) for b in bases]
    out += ["# HELP kvnotes_gateway_ttft_seconds Time to first token of streamed requests.",
            "# TYPE kvnotes_gateway_ttft_seconds histogram"]
    for kind, counts in stats.histogram.items():
        total = 0
        for bound, n in zip([*map(str, TTFT_BUCKETS_S), "+Inf"], counts):
            total += n
            out.append(_line("kvnotes_gateway_ttft_seconds_bucket", {"sent": kind, "le": bound}, total))
        out.append(_line("kvnotes_gateway_ttft_seconds_sum", {"sent": kind}, round(stats.ttft_sum[kind], 6)))
        out.append(_line("kvnotes_gateway_ttft_seconds_count", {"sent": kind}, total))
    out += ["# HELP kvnotes_gateway_checks_total Sampled checks: rewritten requests also sent unchanged.",
            "# TYPE kvnotes_gateway_checks_total counter",
            "# HELP kvnotes_gateway_agreement Sampled agreement of rewritten with unchanged answers.",
            "# TYPE kvnotes_gateway_agreement gauge"]
    for b in bases:
        out.append(_line("kvnotes_gateway_checks_total", {"base": b.base_id, "agreed": "true"}, b.agreed))
        disagreed = b.checks - b.agreed
        out.append(_line("kvnotes_gateway_checks_total", {"base": b.base_id, "agreed": "false"}, disagreed))
        if b.checks:
            out.append(_line("kvnotes_gateway_agreement", {"base": b.base_id}, round(b.agreed / b.checks, 4)))
    out += ["# HELP kvnotes_gateway_base_pass_through 1 when a base was switched to pass-through.",
            "# TYPE kvnotes_gateway_base_pass_through gauge"]
    out += [_line("kvnotes_gateway_base_pass_through", {"base": b.base_id}, int(bool(b.switched)))
            for b in bases]
    return "\n".join(out) + "\n"
