"""Typed values at the engine's boundary: what goes in (fields, questions, placements) and what
comes out (one result per strategy, a report). The CLI, the Celery tasks and the benchmarks speak
only these; `Report.to_dict()` is the JSON contract of `kvnotes edit|compose --json`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from worker.engine.store_tiers import Reuse

if TYPE_CHECKING:
    from worker.engine.mechanism.types import Mechanism

# stage name, fraction done in [0, 1]
ProgressFn = Callable[[str, float], None]


class EngineError(ValueError):
    """Bad input or an impossible operation; the message is one line a person can act on."""


@dataclass(frozen=True)
class Field:
    """A character span [start, end) of the document and the value it should now hold."""

    start: int
    end: int
    new_value: str
    label: str = ""


@dataclass(frozen=True)
class Question:
    """The readout: a question asked after the document. With `choices` the decision is the most
    probable whole choice; without, a greedy generation of up to `max_new_tokens`."""

    text: str
    choices: tuple[str, ...] = ()
    cot: bool = False
    max_new_tokens: int = 32


@dataclass
class StrategyResult:
    """One strategy's decision and its fidelity against `recompute`. The fields are
    `vocabulary.METRICS`, in that order (the CLI JSON, the database columns and the API use them)."""

    decision: str
    choice_probs: dict[str, float]
    kl_to_recompute: float
    top1_agrees: bool
    topk_overlap: int
    logit_cosine: float
    decision_matches_recompute: bool
    tokens_computed: int
    latency_ms: float
    ttft_ms: float
    decode_ms: float
    answer_f1: float
    recompute_answer_nll: float | None
    prefix_cache_share: float
    text: str = ""  # generated text (free answer or chain of thought), "" when scored over choices
    detail: str = ""  # how the strategy ran, e.g. how many downstream tokens selective chose
    picked: str | None = None  # the strategy `auto` picked (None for every other strategy)
    ttft_spread_ms: list[float] = field(default_factory=list)  # [min, max] over the timing repeats
    edit_followed: str | None = None  # "new" | "old" | "both" | "neither"; None without fields
    speedup: float | None = None  # recompute's first token over this one's: median over the paired rounds
    speedup_range: list[float] = field(default_factory=list)  # [min, max] over the paired rounds
    choice_spread: dict[str, list[float]] = field(default_factory=dict)  # [min, max] over the orders
    order_bias: str | None = None  # the position the answer follows more than the document, e.g. "first"
    measure_ms: float = 0.0  # reading the choices over their other orders, after the first token
    orders_read: int = 0  # the orders of the choices read; fewer than `orders_total`: a partial reading
    orders_total: int = 0

    @property
    def partial_orders(self) -> bool:
        """The choices were read over only some of their orders (the reading stopped once settled)."""
        return self.orders_read < self.orders_total


@dataclass
class TokenView:
    """A cached token as the UI shows it: id, text, and its character span in the document (or -1)."""

    id: int
    text: str
    start: int
    end: int
    segment: str  # "frame" | "document" | "skill" | "erratum" | "question" | "answer"


@dataclass
class Attention:
    """Where the decision looked, and where every question and answer token looked.

    tokens: the T tokens: the cached notes (erratum included), the question, then the answer.
    weights: float16 [layers, heads, T], the decision position's attention (zero after it).
    query_weights: float16 [Q, T], the attention of tokens[query_start:] (the question and answer
        tokens), each averaged over layers and heads.
    decision: the index in `tokens` of the decision position (the question's last token)."""

    weights: np.ndarray
    tokens: list[TokenView]
    query_weights: np.ndarray
    query_start: int
    decision: int


@dataclass
class SpanShare:
    """One span of downstream notes in the notes map and the share of the gap patching it closes."""

    start: int  # token index in the new sequence
    end: int
    text: str
    share: float  # fraction of the in_place → recompute KL gap closed by patching this span
    kl_after: float
    start_char: int = -1  # character span in the document; -1 when the span holds no document text
    end_char: int = -1


@dataclass
class EditShare:
    """One changed stretch of the document (a field, or fields too close to tell apart) and the share
    of the stale → recompute gap that refreshing it alone in place closes."""

    start_char: int  # character span in the document
    end_char: int
    share: float
    kl_after: float


@dataclass
class Attribution:
    """The notes map: how far stale and in_place notes are from recompute (KL at the decision), the
    field's own share of that gap, each changed stretch's own share, and each downstream span's."""

    kl_stale: float
    kl_in_place: float
    field_share: float  # fraction of the stale → recompute gap that refreshing the field closed
    spans: list[SpanShare]
    edits: list[EditShare] = field(default_factory=list)  # each field refreshed alone (several fields)

    def to_dict(self) -> dict:
        return {
            "kl_stale": self.kl_stale, "kl_in_place": self.kl_in_place, "field_share": self.field_share,
            "spans": [s.__dict__ for s in self.spans], "edits": [e.__dict__ for e in self.edits],
        }


@dataclass
class Report:
    """What a run found: every strategy's result, the attention maps asked for, and the notes map
    when it was asked for."""

    model: str
    document_tokens: int
    strategies: dict[str, StrategyResult] = field(default_factory=dict)
    dtype: str = ""  # what the run computed in: "float32" | "bfloat16" | "float16"
    device: str = ""  # where: "cpu", "cuda:0", or "cuda:0+cuda:1" for a model spread over devices
    attention: dict[str, Attention] = field(default_factory=dict)
    attribution: Attribution | None = None
    mechanism: Mechanism | None = None  # knockout, selective@K, logit lens (`worker.engine.mechanism`)
    timed: bool = True  # False: decisions only, nothing timed (a sweep's edit past its timed sample)
    # KL of the reference computed exactly from the field on against the true recompute (asked for)
    exact_reference_kl: float | None = None
    # a decision-only run: per strategy, how many orders of the choices its decision read (it stops
    # once no order left could change it), and which strategies' decisions are read off another's
    # readout, the same notes (prefix_reuse off the reference's, computed exactly from the field on)
    orders_read: dict[str, int] = field(default_factory=dict)
    read_from: dict[str, str] = field(default_factory=dict)
    # the document's notes: how many tokens came from the KV store, from which tier (None: the run
    # was given notes, e.g. a sweep's, and looked nothing up)
    store_reuse: Reuse | None = None

    def to_dict(self) -> dict:
        out = {
            "model": self.model,
            "dtype": self.dtype,
            "device": self.device,
            "document_tokens": self.document_tokens,
            "timed": self.timed,
            "strategies": {name: asdict(r) for name, r in self.strategies.items()},
        }
        if self.exact_reference_kl is not None:
            out["exact_reference_kl"] = self.exact_reference_kl
        if self.orders_read:
            out["orders_read"] = dict(self.orders_read)
        if self.read_from:
            out["read_from"] = dict(self.read_from)
        if self.store_reuse is not None:
            out["store_reuse"] = self.store_reuse.to_dict()
        if self.attribution is not None:
            out["attribution"] = self.attribution.to_dict()
        if self.mechanism is not None:
            out["mechanism"] = self.mechanism.to_dict()
        return out
