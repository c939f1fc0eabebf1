"""What the mechanism views found, as typed values: a reading of the decision, knockout rows with
their random controls, selective@K curves with K*, and the logit lens. Torch-free; `to_dict` is the
JSON the worker maps into the database."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Reading:
    """The decision at the first answer token under some notes: what it decides, the probability
    of recompute's answer token, and KL(recompute ‖ these notes) there."""

    decision: str
    p_answer: float
    kl: float


@dataclass
class Control:
    """A random set of the same size knocked out instead, `draws` times: mean and spread (standard
    deviation over the draws) of p(recompute's answer) and KL, and the share of draws that keep
    recompute's decision."""

    size: int
    draws: int
    p_answer: float
    p_answer_spread: float
    kl: float
    kl_spread: float
    agreement: float


@dataclass
class KnockoutRow:
    """One region masked at the decision token, in `layers` ("all", "early", "middle", "late"), for
    one strategy's notes. `reading` and `control` are None when the region is empty in this run
    (`note` then says why)."""

    strategy: str
    region: str  # field | downstream_top10 | downstream_top25 | downstream_top8 | sink | errata | skills
    layers: str
    size: int
    reading: Reading | None = None
    control: Control | None = None
    agrees: bool | None = None  # the decision is still recompute's unmasked one
    note: str = ""


@dataclass
class KPoint:
    """Selective@K: the fields plus the K highest-ranked downstream tokens recomputed."""

    k: int
    reading: Reading
    agrees: bool  # the decision is recompute's


@dataclass
class Curve:
    """One ranking of the downstream tokens and its sweep over K; `k_star` the smallest K that
    restores recompute's decision and keeps it for every larger K (None when no K does)."""

    ranking: str  # notes_map | attention | kv_deviation | random
    points: list[KPoint]
    k_star: int | None
    note: str = ""


@dataclass
class Mechanism:
    """The three views of one run. `answer` is recompute's first answer token (its text) and
    `decision` recompute's decision read at that token; `shown` the strategy knocked out beside
    recompute; `costs` each view's cost in recomputes (tokens run through the model over a
    recompute's); `notes` lines for what could not be measured."""

    answer: str
    decision: str
    shown: str | None
    unmasked: dict[str, Reading] = field(default_factory=dict)
    knockout: list[KnockoutRow] = field(default_factory=list)
    downstream: int = 0  # downstream tokens selective@K chooses from
    selective_k: list[Curve] = field(default_factory=list)
    selective_skipped: str = ""  # why the selective@K sweep did not run (in_place already agrees)
    logit_lens: dict[str, list[float]] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    read_at: str = ""  # which answer token the views read, and why there (`vocabulary.agreement`)
    # each strategy read at its own answer's deciding token (issue 51 item 7): its token there, and
    # where and why, in words (recompute's is `answer` and `read_at`)
    answer_by: dict[str, str] = field(default_factory=dict)
    read_at_by: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
