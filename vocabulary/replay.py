"""The serving replay's words: its variants, and what a replay reports per variant (the `--json`
contract of `kvnotes replay`, the API's answer and the `replays.result` column).

Stdlib only: `serving` fills these, the data layer stores them (pydantic validates the dataclasses)
and the web app reads them, from one definition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

VARIANTS = ("in_place", "erratum", "hoist")

VARIANT_HELP = {
    "in_place": "the field rewritten in the prompt (recompute's prompt): the cache breaks at the field",
    "erratum": "the original prompt plus an appended erratum: the cache keeps everything before it",
    "hoist": "the field's line moved after the document: the cache keeps the document",
}

# The per-variant numbers every replay reports, in order, with what each measures (the panel's legend).
REPORTED = {
    "requests": "requests sent (after one unmeasured warm-up request with the prompt before the edits)",
    "prefix_hit_rate": "prompt tokens the server took from its prefix cache, over all prompt tokens",
    "ttft_p50_ms": "time to first token, median, from sending the request (ms)",
    "ttft_p90_ms": "time to first token, 90th percentile (ms)",
    "throughput_rps": "requests finished per second, from the first arrival to the last answer",
    "prompt_tokens": "prompt tokens per request, mean",
    "agreement": "share of answers that name the field's current value (edit_followed = new)",
}


@dataclass
class VariantResult:
    """What one variant measured. The first seven fields are `REPORTED`; the lists hold one entry per
    request, in request order."""

    requests: int
    prefix_hit_rate: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    throughput_rps: float
    prompt_tokens: int
    agreement: float
    cached_tokens: int = 0  # over the variant
    metrics_hit_rate: float | None = None  # the same rate from /metrics deltas (None: no counters)
    estimated_prefix_share: float = 0.0  # kvnotes's estimate: the common prefix with the warm prompt
    cache_reset: bool = False  # the server's prefix cache was emptied before the warm request
    ttft_ms: list[float] = field(default_factory=list)
    hit_rates: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)


@dataclass
class ReplayResult:
    """A finished replay: the server, the load it ran under and each variant's result."""

    url: str
    model: str
    rate: float
    concurrency: int
    max_model_len: int
    load_average: float
    variants: dict[str, VariantResult]
    # how prompts were sent: "chat" (the user message of the model's chat template, through
    # /v1/chat/completions) or "plain" (a model without one: the text as kvnotes frames it, through
    # /v1/completions)
    prompt_format: str = "chat"

    def to_dict(self) -> dict:
        return asdict(self)
