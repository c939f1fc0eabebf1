"""One measure loop for edits and compositions: every strategy timed the same way, then scored
against recompute.

Each strategy is timed in this process, after a warm-up, from the cached notes (and compiled skills)
to its decision: its surgery, then the readout (`worker.engine.readout.decide`), which also computes
the tokens it deferred or appended. A strategy that starts from spliced notes pays for the splice and
its seam repair too (`Bench.overhead_ms`, `overhead_tokens`).

**Timings that are not noise.** One timing of a 10 ms strategy on a shared CPU is mostly noise, so
after the first pass every fast strategy is timed again, round-robin across the strategies (never
back to back, so a slow spell of the machine is shared out), until its first-token times add up to
`REPEAT_BUDGET_MS` or it has `MAX_SAMPLES`. A repeat re-runs the surgery and the readout up to the
first answer token only (a free answer's generation would spend the budget on decoding, which is not
what the speed-up compares) and keeps nothing but that time: the notes, the decision and every other
metric are the first run's. `ttft_ms` is the median of the first-token times and `ttft_spread` their
[min, max]; `latency_ms` is the first run's (the only one that decoded).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vocabulary.prefix import common_prefix
from worker.engine.compare import fidelity, same_answer, token_f1
from worker.engine.edit import Surgery
from worker.engine.notes import cache_from_layers
from worker.engine.readout import Readout, answer_nll, decide
from worker.engine.strategies.base import Strategy
from worker.engine.types import ProgressFn, Question, StrategyResult

if TYPE_CHECKING:
    from worker.engine.loaded import LoadedModel

REPEAT_BUDGET_MS = 300.0  # a strategy is timed again until its timings add up to this ...
MAX_SAMPLES = 5  # ... or it was timed this many times


@dataclass(frozen=True)
class Sample:
    """One timing of a strategy: to the whole answer and to the first answer token."""

    latency_ms: float | None  # None for a repeat, which stops at the first token
    ttft_ms: float


@dataclass
class Outcome:
    """One strategy's notes after surgery, its readout, what it cost (medians over its timings), and,
    once every strategy ran, how it scores recompute's answer.

    samples: every timing, first run first; picked: the strategy a composite (auto) chose."""

    surgery: Surgery
    readout: Readout
    samples: list[Sample]
    answer_nll: float | None = None  # of recompute's answer under these notes
    prefix_cache_share: float = 0.0
    picked: str | None = None

    @property
    def latency_ms(self) -> float:
        """To the whole answer: the first run's time, less its first token's, plus the median first
        token (so latency - ttft stays the decode time)."""
        first = self.samples[0]
        return first.latency_ms - first.ttft_ms + self.ttft_ms

    @property
    def ttft_ms(self) -> float:
        return statistics.median(s.ttft_ms for s in self.samples)

    @property
    def ttft_spread(self) -> tuple[float, float]:
        return min(s.ttft_ms for s in self.samples), max(s.ttft_ms for s in self.samples)


@dataclass(frozen=True)
class Bench:
    """What every strategy of one run is read and timed with.

    overhead_ms / overhead_tokens: what the cached notes cost before any strategy starts (the
    splice of placed skills and its seam repair), charged to every strategy that reads them."""

    engine: LoadedModel
    question: Question
    suffix_ids: list[int]
    overhead_ms: float = 0.0
    overhead_tokens: int = 0
    progress: ProgressFn = field(default=lambda stage, fraction: None)
    span: tuple[float, float] = (0.05, 0.65)  # the progress fractions the measuring covers


def measure(bench: Bench, case: object, runners: dict[str, Strategy]) -> dict[str, Outcome]:
    """Prepare, time and repeat every runner; its outcome (first run's notes and readout, all times)."""
    for runner in runners.values():
        runner.prepare(case)  # outside the timings
    bench.engine.warm_up()
    first: dict[str, tuple[Surgery, Readout]] = {}
    samples: dict[str, list[Sample]] = {}
    low, high = bench.span
    for i, (name, runner) in enumerate(runners.items()):
        bench.progress(f"strategy: {name}", low + (high - low) * i / len(runners))
        surgery, readout, sample = _timed(bench, runner, case)
        if runner.reads_notes:
            surgery.tokens_computed += bench.overhead_tokens
        first[name], samples[name] = (surgery, readout), [sample]
    bench.progress("timing the fast strategies again", high)
    _repeat(bench, case, runners, samples)
    return {name: Outcome(*first[name], samples[name]) for name in runners}


def _timed(bench: Bench, runner: Strategy, case: object,
           first_token_only: bool = False) -> tuple[Surgery, Readout, Sample]:
    """One timed run: the surgery, then the readout, which completes any deferred tokens (up to the
    first answer token only, for a repeat)."""
    engine = bench.engine
    t0 = time.perf_counter()
    surgery = runner.surgery(case)
    cache = cache_from_layers(surgery.layers, engine.model)
    readout = decide(engine.model, engine.tokenizer, engine.frame, cache, bench.suffix_ids, bench.question,
                     pending=surgery.pending, deferred=surgery.deferred, first_token_only=first_token_only)
    surgery = surgery.completed(readout.deferred_kv)  # writes the deferred K/V into the strategy's notes
    ms, ttft = (time.perf_counter() - t0) * 1000, (readout.first_token_at - t0) * 1000
    extra = bench.overhead_ms if runner.reads_notes else 0.0
    return surgery, readout, Sample(None if first_token_only else ms + extra, ttft + extra)


def due_again(samples: list[Sample]) -> bool:
    """Whether a strategy with these timings is timed once more."""
    return len(samples) < MAX_SAMPLES and sum(s.ttft_ms for s in samples) < REPEAT_BUDGET_MS


def _repeat(bench: Bench, case: object, runners: dict[str, Strategy],
            samples: dict[str, list[Sample]]) -> None:
    """Round-robin over the strategies still due: one more timing each per round."""
    while due := [name for name in runners if due_again(samples[name])]:
        for name in due:
            samples[name].append(_timed(bench, runners[name], case, first_token_only=True)[2])


def score(bench: Bench, case: object, runners: dict[str, Strategy], outcomes: dict[str, Outcome],
          reference: str) -> None:
    """Outside the timings: how likely each strategy's notes find recompute's answer (teacher-forced
    NLL), and its prefix-cache share: the share of the prompt it sends (notes, then the question)
    that an exact-prefix serving cache already holds from the original prompt (`cached_ids`, then
    the same question), so the old prompt unchanged (stale) reads 1.0."""
    answer = outcomes[reference].readout.answer_ids
    for name, out in outcomes.items():
        s = out.surgery
        out.answer_nll = answer_nll(bench.engine.model, s.layers, list(s.pending) + bench.suffix_ids, answer)
        final = list(s.token_ids) + bench.suffix_ids  # token_ids already end with the pending ones
        held = runners[name].cached_ids(case) + bench.suffix_ids
        out.prefix_cache_share = common_prefix(held, final) / len(final)


def result_of(out: Outcome, ref: Outcome, followed: Callable[[str], str | None] = lambda answer: None,
              ) -> StrategyResult:
    """A strategy's metrics against recompute's outcome `ref`; `followed` gives an answer's
    `edit_followed` verdict (None without fields)."""
    f = fidelity(ref.readout.logits, out.readout.logits)
    low, high = out.ttft_spread
    return StrategyResult(
        decision=out.readout.decision,
        choice_probs=out.readout.choice_probs,
        kl_to_recompute=f.kl_to_recompute,
        top1_agrees=f.top1_agrees,
        topk_overlap=f.topk_overlap,
        logit_cosine=f.logit_cosine,
        decision_matches_recompute=same_answer(out.readout.decision, ref.readout.decision),
        tokens_computed=out.surgery.tokens_computed,
        latency_ms=round(out.latency_ms, 3),
        ttft_ms=round(out.ttft_ms, 3),
        decode_ms=round(max(out.latency_ms - out.ttft_ms, 0.0), 3),
        answer_f1=round(token_f1(out.readout.decision, ref.readout.decision), 4),
        recompute_answer_nll=None if out.answer_nll is None else round(out.answer_nll, 5),
        prefix_cache_share=round(out.prefix_cache_share, 4),
        text=out.readout.text,
        detail=out.surgery.detail,
        picked=out.picked,
        ttft_spread_ms=[round(low, 3), round(high, 3)],
        edit_followed=followed(out.readout.decision),
    )
