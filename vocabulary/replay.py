"""The serving replay's words: its variants, what a replay sends (`ReplaySpec`: the web app's
request becomes one, the `replays.snapshot` column stores it, the worker and `kvnotes replay` run
it) and what it reports per variant (the `--json` contract of `kvnotes replay`, the API's answer and
the `replays.result` column). A trajectory replayed turn by turn has its own pair, in the same
column: `TrajectoryReplaySpec` (the turns, one request each, in order) and `TrajectoryReplayResult`
(per variant, every turn's hit rate and TTFT, and the cumulative TTFT).

Stdlib only: `serving` fills these, the data layer stores them (pydantic validates the dataclasses)
and the web app reads them, from one definition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from vocabulary.strategies import APPEND_ERRATUM, HOIST_FIELDS, REWRITE, served
from vocabulary.trajectories import FieldSpec, SkillSpec, TurnSpec

# The serving layouts a replay sends (`serving.streams` for an edit replayed, `serving.trajectory`
# for a trajectory), each with what its prompts are. A replay's variants are the strategies whose
# descriptor has one of these layouts (`StrategyInfo.serving_layout`), in rank order; the stored and
# the API's variant values are those strategies' names.
LAYOUT_HELP = {
    REWRITE: "the field rewritten in the prompt (recompute's prompt): the cache breaks at the field",
    APPEND_ERRATUM: "the original prompt plus an appended erratum: the cache keeps everything before it",
    HOIST_FIELDS: "the field's line moved after the document: the cache keeps the document",
}
REPLAY_LAYOUTS = tuple(LAYOUT_HELP)

LAYOUT_OF: dict[str, str] = served(REPLAY_LAYOUTS)  # {variant: its serving layout}
VARIANTS = tuple(LAYOUT_OF)
VARIANT_HELP = {name: LAYOUT_HELP[layout] for name, layout in LAYOUT_OF.items()}


@dataclass(frozen=True)
class ReplaySpec:
    """What a replay sends, declared once: the document, the field [start, end) that changes, the
    values it takes in turn, the question and its choices (with those added for this replay), the
    load (how many requests, their Poisson rate, the concurrency cap), and the server (`url`, "" =
    the caller names it; `model`, "" = the one it serves). The web app builds it, the `replays`
    table stores it (its `snapshot`), the worker, `kvnotes replay` and `serving` read it."""

    document: str
    start: int
    end: int
    label: str
    values: tuple[str, ...]
    question: str
    choices: tuple[str, ...] = ()
    requests: int = 0  # 0: one request per value
    rate: float = 1.0  # requests per second (Poisson arrivals)
    concurrency: int = 4  # requests in flight at most
    variants: tuple[str, ...] = VARIANTS
    max_tokens: int = 16  # answer tokens generated per request
    seed: int = 0  # of the arrival times
    url: str = ""  # the server
    model: str = ""  # the served model ("" = the one it serves)
    extended_choices: tuple[str, ...] = ()  # values added to the question's choices for this replay

    @property
    def old_value(self) -> str:
        return self.document[self.start:self.end]

    @property
    def total_requests(self) -> int:
        """Requests per variant."""
        return self.requests or len(self.values)

    @classmethod
    def of(cls, fields: Mapping) -> ReplaySpec:
        """A spec from stored fields of the same names (lists become tuples; other keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in names})

    def replace(self, **changes: object) -> ReplaySpec:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def problems(self) -> list[str]:
        """Every reason this spec cannot run, each naming the field and the limit ([] when none)."""
        out = []
        if not 0 <= self.start < self.end <= len(self.document):
            out.append(f"field [{self.start}, {self.end}) must be a non-empty span inside the document "
                       f"({len(self.document)} characters)")
        if not self.values or any(not v.strip() for v in self.values):
            out.append("values: give at least one non-empty value for the field")
        if not self.question.strip():
            out.append("question: must not be empty")
        if self.choices and len(self.choices) < 2:
            out.append("choices: give at least two, or none for a free answer")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            out.append(f"variants: unknown {', '.join(map(repr, unknown)) or '(none given)'}; "
                       f"valid: {', '.join(VARIANTS)}")
        if self.requests < 0:
            out.append(f"requests: must be at least 1, got {self.requests}")
        if not self.rate > 0:
            out.append(f"rate: must be more than 0 requests per second, got {self.rate}")
        if self.concurrency < 1:
            out.append(f"concurrency: must be at least 1, got {self.concurrency}")
        if self.max_tokens < 1:
            out.append(f"max_tokens: must be at least 1, got {self.max_tokens}")
        return out

    def check(self) -> None:
        """A ValueError listing every problem, or nothing."""
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))


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


# ---- a trajectory replayed --------------------------------------------------------------------------
# An agent loop on a server: one request per turn, in order, each prompt the last turn's plus what
# this turn appends, with the field changes carried the variant's way (`serving.trajectory`).

TRAJECTORY_LAYOUT_HELP = {
    REWRITE: "the document with the fields' current values, then the turns: the prompt breaks at a "
             "changed field, so the cache keeps only what precedes it",
    APPEND_ERRATUM: "the document as it was, the turns, and an erratum appended at the turn a field "
                    "changed: each prompt extends the last, so the cache keeps all of it",
    HOIST_FIELDS: "the fields' lines moved after the document and the turns, holding the current values: "
                  "the cache keeps everything before them",
}
TRAJECTORY_VARIANT_HELP = {name: TRAJECTORY_LAYOUT_HELP[layout] for name, layout in LAYOUT_OF.items()}


@dataclass(frozen=True)
class TrajectoryReplaySpec:
    """What a trajectory replay sends: the document with its labelled fields (their first values in
    place), the turns in order (`vocabulary.trajectories.TurnSpec`; a skill a turn places is its
    text, before the turn's own), the question asked where a turn asks none, the variants and the
    server. One request per turn and variant, in order (an agent
    loop is sequential). The web app builds it from a stored trajectory (`trajectory_id`; None from
    the command line), the `replays` table stores it (its `snapshot`), the worker runs it."""

    document: str
    fields: tuple[FieldSpec, ...]
    turns: tuple[TurnSpec, ...]
    question: str
    choices: tuple[str, ...] = ()
    variants: tuple[str, ...] = VARIANTS
    max_tokens: int = 16
    url: str = ""
    model: str = ""
    trajectory_id: int | None = None
    skills: tuple[SkillSpec, ...] = ()  # the skills the turns place (their text goes before the turn's)

    @property
    def total_requests(self) -> int:
        """Requests per variant: one per turn."""
        return len(self.turns)

    def replace(self, **changes: object) -> TrajectoryReplaySpec:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def problems(self) -> list[str]:
        """Every reason this spec cannot run, each naming the turn or the field ([] when none)."""
        out = []
        labels = [f.label for f in self.fields]
        if any(not label.strip() for label in labels) or len(set(labels)) != len(labels):
            out.append("fields: every field needs a label of its own (a turn names a field by its label)")
        spans = sorted((f.start, f.end, f.label) for f in self.fields)
        for start, end, label in spans:
            if not 0 <= start < end <= len(self.document):
                out.append(f"fields: {label!r} [{start}, {end}) must be a non-empty span inside the "
                           f"document ({len(self.document)} characters)")
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if start < end:
                out.append(f"fields: {a!r} and {b!r} overlap")
        if not self.turns:
            out.append("turns: give at least one turn")
        if self.choices and len(self.choices) < 2:
            out.append("choices: give at least two, or none for a free answer")
        for n, turn in enumerate(self.turns, start=1):
            if not turn.append and not turn.fields and turn.question is None and turn.skill is None:
                out.append(f"turn {n} is empty: it appends nothing, changes no field, places no skill "
                           "and asks nothing")
            skills = [s.name for s in self.skills]
            if turn.skill is not None and turn.skill not in skills:
                out.append(f"turn {n} places a skill {turn.skill!r} that the trajectory does not have "
                           f"(skills: {', '.join(skills) or 'none'})")
            unknown = [label for label in turn.fields if label not in labels]
            if unknown:
                out.append(f"turn {n} changes a field {unknown[0]!r} that the document does not have "
                           f"(fields: {', '.join(labels) or 'none'})")
            if any(not value.strip() for value in turn.fields.values()):
                out.append(f"turn {n} sets a field to an empty value")
            if turn.question is not None and not turn.question.strip():
                out.append(f"turn {n}'s question is empty")
            elif turn.question is None and not self.question.strip():
                out.append(f"turn {n} asks no question and the trajectory has none")
            if turn.choices and len(turn.choices) < 2:
                out.append(f"turn {n}: give at least two choices, or none for a free answer")
        unknown_variants = [v for v in self.variants if v not in VARIANTS]
        if unknown_variants or not self.variants:
            out.append(f"variants: unknown {', '.join(map(repr, unknown_variants)) or '(none given)'}; "
                       f"valid: {', '.join(VARIANTS)}")
        if self.max_tokens < 1:
            out.append(f"max_tokens: must be at least 1, got {self.max_tokens}")
        return out


# What a trajectory replay reports per turn, in order (the panel's legend).
TURN_REPORTED = {
    "hit_rate": "cached / prompt tokens of this turn's request, as the server's usage reports them",
    "ttft_ms": "time to first token of this turn's request, from sending it (ms)",
    "cumulative_ttft_ms": "the TTFTs of this variant's turns so far, summed (ms)",
    "prompt_tokens": "tokens of this turn's prompt (the server's count)",
    "cached_tokens": "of them, those the server took from its prefix cache",
    "estimated_share": "kvnotes's estimate: the longest prefix, in tokens, this prompt shares with an "
                       "earlier prompt of the variant, over its length (an exact-prefix cache of any size)",
    "edit_followed": "the answer names the fields' current values (new) or earlier ones (old); blank "
                     "before any field changed",
}


@dataclass
class TurnHit:
    """One turn of one variant as the server answered it (index from 0)."""

    index: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    ttft_ms: float
    cumulative_ttft_ms: float
    answer: str
    edit_followed: str | None  # None: no field differs from its first value yet
    changed: list[str] = field(default_factory=list)  # the labels this turn changed
    estimated_share: float = 0.0
    errata: int = 0  # errata in this turn's prompt (the erratum variant)


@dataclass
class TrajectoryVariantResult:
    """One variant over the turns: each turn, and over them all the hit rate (Σ cached / Σ prompt
    tokens), the cumulative TTFT (the turns' TTFTs summed) and the tokens."""

    turns: list[TurnHit]
    hit_rate: float
    cumulative_ttft_ms: float
    prompt_tokens: int  # over the turns
    cached_tokens: int  # over the turns
    followed: int  # turns whose answer named the current values (edit_followed = new) ...
    moved_turns: int  # ... of the turns where a field differed from its first value
    metrics_hit_rate: float | None = None  # the same rate from /metrics deltas (None: no counters)
    cache_reset: bool = False  # the server's prefix cache was emptied before the warm request


@dataclass
class TrajectoryReplayResult:
    """A finished trajectory replay: the server and each variant's turns."""

    url: str
    model: str
    max_model_len: int
    load_average: float
    variants: dict[str, TrajectoryVariantResult]
    prompt_format: str = "chat"  # as `ReplayResult.prompt_format`
    trajectory_id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)
