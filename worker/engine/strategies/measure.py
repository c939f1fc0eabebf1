"""One measure loop for edits and compositions: every strategy timed the same way, then scored
against recompute.

Each strategy is timed in this process, after a warm-up, from the cached notes (and compiled skills)
to its decision: its surgery, then the readout (`worker.engine.readout.decide`), which also computes
the tokens it deferred or appended. A strategy that starts from spliced notes pays for the splice and
its seam repair too (`Bench.overhead_ms`, `overhead_tokens`).

**Speed-ups from paired timings.** A speed-up divided by one timing of recompute moves with the
machine (three identical runs once read 18.4×, 10.5× and 17.4×, as recompute took 4.7, 2.7 and
3.5 s). So the timing runs in `PAIRED_ROUNDS` rounds: the first pass, then rounds in which every
strategy, recompute included, is timed again one after the other. Within a round a fast strategy is
timed again, round-robin across the strategies (never back to back, so a slow spell of the machine
is shared out), until its first-token times in the round add up to `ROUND_BUDGET_MS` or it has
`ROUND_SAMPLES`. Each round gives one speed-up, recompute's first token in that round over the
strategy's (the median of its timings in the round), and the result's `speedup` is their median.
`speedup_range` is the widest the rounds allow: recompute's fastest round over the strategy's
slowest, to recompute's slowest over its fastest (it holds every paired speed-up). Two identical
runs' ranges then overlap unless every round of one run was faster on one side and slower on the
other than every round of the other run; "too short to time" is read from it (across 1×, or wider
than a factor of 2).

**More rounds where the timing is cheap.** Two identical runs' speed-ups once differed by a ratio
of 0.71 to 1.23 with three rounds. After `PAIRED_ROUNDS`, rounds keep coming, up to `MAX_ROUNDS`,
while everything timed so far (every strategy's first tokens, recompute's included) adds up to less
than `CHEAP_TIMING_MS`: a run whose recompute takes seconds keeps its three rounds, one whose
timings are short (a small model, a GPU) gets up to nine, and its median moves less between runs.

**Decisions only.** A sweep edit after its timed sample (`measure(..., timing=False)`) runs each
strategy once, untimed: its surgery (`Strategy.decision_surgery`) and its readout, no warm-up and no
rounds. Its timing metrics are then 0 and its speed-up None (the sweep's speed-up comes from its
timed edits). The reference is computed exactly from the first change on (the notes before it are
the same cache), and strategies whose notes are the same (prefix_reuse and that reference) share
one readout.

The first token is ONE readout, the choices in their listed order; reading them over the other
orders (the decision's debiasing, `worker.engine.orders`) comes after it and is kept apart
(`measure_ms`), out of both the first token and the latency.

A repeat re-runs the surgery and the readout up to the first answer token only (a free answer's
generation would spend the time on decoding, which is not what the speed-up compares) and keeps
nothing but that time: the notes, the decision and every other metric are the first run's. `ttft_ms`
is the median of all the first-token times and `ttft_spread` their [min, max]; `latency_ms` is the
first run's (the only one that decoded).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from vocabulary.prefix import common_prefix
from worker.engine.batched import Row, decide_all
from worker.engine.compare import fidelity, same_answer, token_f1
from worker.engine.decode import drafted_answer
from worker.engine.edit import Surgery
from worker.engine.forward import answer_nll
from worker.engine.notes import cache_from_layers
from worker.engine.readout import Readout, decide, orders_suffixes
from worker.engine.strategies.base import Strategy
from worker.engine.types import ProgressFn, Question, StrategyResult

if TYPE_CHECKING:
    from worker.engine.loaded import LoadedModel

PAIRED_ROUNDS = 3  # every strategy, recompute included, is timed in this many rounds (the first pass is one)
MAX_ROUNDS = 9  # ... and in up to this many while the timing is cheap:
CHEAP_TIMING_MS = 1500.0  # every first token timed so far adds up to less than this
ROUND_BUDGET_MS = 100.0  # within a round, a strategy is timed again until its timings add up to this ...
ROUND_SAMPLES = 3  # ... or it was timed this many times in the round
# a decision-only free answer starts from a draft: the same strategy's answer at the edit before, its
# field values replaced (`worker.engine.decode.start_rows` keeps what greedy decoding chooses of it,
# so the answers are the same either way); bench/sweep_cases.py and bench/sweep_drafts.py turn it off
# to show what it saves
DRAFTS = True


@dataclass(frozen=True)
class Sample:
    """One timing of a strategy: to the whole answer and to the first answer token."""

    latency_ms: float | None  # None for a repeat, which stops at the first token
    ttft_ms: float
    round: int = 0  # the timing round it belongs to: its speed-up pairs with recompute's in the round


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
    timed: bool = True  # False for a decision-only run: its samples are no timings
    read_from: str | None = None  # a decision-only run: the strategy whose readout (same notes) it took

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

    def round_ttft(self) -> dict[int, float]:
        """The median first-token time of each timing round."""
        rounds: dict[int, list[float]] = {}
        for s in self.samples:
            rounds.setdefault(s.round, []).append(s.ttft_ms)
        return {r: statistics.median(times) for r, times in rounds.items()}


def paired_speedups(out: Outcome, ref: Outcome) -> list[float]:
    """One speed-up per timing round both were timed in: `ref`'s first token in that round over
    `out`'s (round by round, so a slow spell of the machine slows both sides of a ratio)."""
    mine, theirs = out.round_ttft(), ref.round_ttft()
    return [theirs[r] / mine[r] for r in sorted(mine) if r in theirs and mine[r] > 0]


def speedup_range(out: Outcome, ref: Outcome) -> tuple[float, float] | None:
    """[min, max] of the speed-up over the rounds both were timed in: `ref`'s fastest round over
    `out`'s slowest, to `ref`'s slowest over `out`'s fastest (None without a common round)."""
    mine, theirs = out.round_ttft(), ref.round_ttft()
    common = [r for r in mine if r in theirs and mine[r] > 0]
    if not common:
        return None
    return (min(theirs[r] for r in common) / max(mine[r] for r in common),
            max(theirs[r] for r in common) / min(mine[r] for r in common))


@dataclass(frozen=True)
class Bench:
    """What every strategy of one run is read and timed with.

    overhead_ms / overhead_tokens: what the cached notes cost before any strategy starts (the
    splice of placed skills and its seam repair), charged to every strategy that reads them."""

    engine: LoadedModel
    question: Question
    suffix_ids: list[int]
    orders: list[list[int]] = field(default_factory=list)  # the question in the choices' other cyclic orders
    overhead_ms: float = 0.0
    overhead_tokens: int = 0
    progress: ProgressFn = field(default=lambda stage, fraction: None)
    span: tuple[float, float] = (0.05, 0.65)  # the progress fractions the measuring covers
    # (the cached notes' layers, a dict kept with them): a decision-only run keeps the readout of the
    # notes themselves there, for the next run from the same notes and question (a sweep's edits)
    kept: tuple[list, dict] | None = None

    def __post_init__(self) -> None:
        """A choice question asked as the frame asks it is scored over every cyclic order of its
        choices (`worker.engine.orders`); a custom suffix (a blend's own) keeps its listed order."""
        engine, question = self.engine, self.question
        if not self.orders and self.suffix_ids == engine.encode(engine.frame.suffix(question)):
            object.__setattr__(self, "orders", orders_suffixes(engine.tokenizer, engine.frame, question))


def measure(bench: Bench, case: object, runners: dict[str, Strategy],
            timing: bool = True) -> dict[str, Outcome]:
    """Prepare, time and repeat every runner in `PAIRED_ROUNDS` rounds or more (`rounds_due`); its
    outcome (the first run's notes and readout, every timing with its round). Without `timing`, each
    runner once, untimed (`decisions`)."""
    for runner in runners.values():
        runner.prepare(case)  # outside the timings
    if not timing:
        return decisions(bench, case, runners)
    bench.engine.warm_up()
    first: dict[str, tuple[Surgery, Readout]] = {}
    samples: dict[str, list[Sample]] = {}
    low, high = bench.span
    first_share = (high - low) / 2  # the first pass (with decoding) takes about half the measuring
    for i, (name, runner) in enumerate(runners.items()):
        bench.progress(f"strategy: {name}", low + first_share * i / len(runners))
        surgery, readout, sample = _timed(bench, runner, case)
        if runner.reads_notes:
            surgery.tokens_computed += bench.overhead_tokens
        first[name], samples[name] = (surgery, readout), [sample]
    _repeat(bench, case, runners, samples, 0)
    round_ = 1
    while rounds_due(round_, samples):
        bench.progress(f"timing again beside recompute (round {round_ + 1})",
                       low + first_share + (high - low - first_share) * min(round_ / MAX_ROUNDS, 1.0))
        for name, runner in runners.items():
            samples[name].append(_timed(bench, runner, case, first_token_only=True, round_=round_)[2])
        _repeat(bench, case, runners, samples, round_)
        round_ += 1
    return {name: Outcome(*first[name], samples[name]) for name in runners}


def rounds_due(round_: int, samples: dict[str, list[Sample]]) -> bool:
    """Whether timing round `round_` (0 is the first pass) runs: the first `PAIRED_ROUNDS` always,
    then up to `MAX_ROUNDS` while every first token timed so far adds up to under `CHEAP_TIMING_MS`."""
    if round_ < PAIRED_ROUNDS:
        return True
    spent = sum(s.ttft_ms for timings in samples.values() for s in timings)
    return round_ < MAX_ROUNDS and spent < CHEAP_TIMING_MS


def decisions(bench: Bench, case: object, runners: dict[str, Strategy]) -> dict[str, Outcome]:
    """Every runner once, untimed: its decision surgery, then every readout together
    (`worker.engine.readout.decide_all`: a choice question's readouts in as few batched forwards as
    pays). Runners whose notes are the same objects, with nothing appended or deferred, share one
    readout; the readout of the cached notes themselves (stale's) is kept in `bench.kept` for the
    next run from the same notes (a sweep's next edit). Its samples are zeros."""
    engine, low, high = bench.engine, *bench.span
    surgeries: dict[str, Surgery] = {}
    for i, (name, runner) in enumerate(runners.items()):
        bench.progress(f"decision: {name}", low + (high - low) * i / len(runners))
        surgeries[name] = runner.decision_surgery(case)
    lasting, memo = bench.kept if bench.kept is not None else (None, {})
    keys: dict[str, object] = {}
    todo: dict[object, Surgery] = {}
    for name, s in surgeries.items():
        key = id(s.layers) if not s.pending and s.deferred is None else name
        keys[name] = key
        if key not in todo and not (s.layers is lasting and key == id(lasting) and "notes" in memo):
            todo[key] = s
    owner = {key: name for name, key in reversed(keys.items())}  # the first strategy of each notes
    values = tuple(f.new_value for f in getattr(case, "fields", ()))
    earlier = memo.get("answers", {}) if DRAFTS else {}
    drafts = [drafted_answer(engine.tokenizer, *earlier[owner[key]][1:], earlier[owner[key]][0], values)
              if owner[key] in earlier else [] for key in todo]
    got = decide_all(engine.model, engine.tokenizer, engine.frame,
                     [Row(s.layers, tuple(s.pending), s.deferred) for s in todo.values()], bench.suffix_ids,
                     bench.question, bench.orders, drafts, orders_at_once=memo.get("read every order", False))
    read: dict[object, Readout] = dict(zip(todo, got))
    if bench.orders and got:  # no row could stop early: the next edit reads every order in one forward
        memo["read every order"] = all(r.orders_needed > len(bench.orders) for r in got)
    if lasting is not None and id(lasting) in read:
        memo["notes"] = read[id(lasting)]
    if not bench.question.choices and not bench.question.cot:  # the next edit's drafts
        memo["answers"] = {owner[key]: (values, r.answer_ids, r.answer_end) for key, r in read.items()}
    out = {}
    for name, runner in runners.items():
        s = surgeries[name]
        readout = read[keys[name]] if keys[name] in read else memo["notes"]
        s = s.completed(readout.deferred_kv)
        if runner.reads_notes:
            s.tokens_computed += bench.overhead_tokens
        source = owner[keys[name]] if owner[keys[name]] != name else None
        notes = [s.detail]
        if source is not None:  # said where it shows: the run JSON's detail and `Report.read_from`
            notes.append(f"its decision read off {source}'s readout (the same notes)")
        if readout.drafted:
            notes.append(f"{readout.drafted} answer token(s) kept from a draft (its answer at the edit "
                         "before, checked token by token: the same answer as decoding them)")
        if len(notes) > 1:
            s = replace(s, detail="; ".join(part for part in notes if part))
        out[name] = Outcome(s, readout, [Sample(0.0, 0.0, 0)], timed=False, read_from=source)
    return out


def _timed(bench: Bench, runner: Strategy, case: object, first_token_only: bool = False,
           round_: int = 0) -> tuple[Surgery, Readout, Sample]:
    """One timed run: the surgery, then the readout, which completes any deferred tokens (up to the
    first answer token only, for a repeat)."""
    engine = bench.engine
    t0 = time.perf_counter()
    surgery = runner.surgery(case)
    cache = cache_from_layers(surgery.layers, engine.model)
    readout = decide(engine.model, engine.tokenizer, engine.frame, cache, bench.suffix_ids, bench.question,
                     pending=surgery.pending, deferred=surgery.deferred, first_token_only=first_token_only,
                     orders=bench.orders)
    surgery = surgery.completed(readout.deferred_kv)  # writes the deferred K/V into the strategy's notes
    # the choices read over their other orders are measurement: out of the latency too
    ms, ttft = (time.perf_counter() - t0) * 1000 - readout.measure_ms, (readout.first_token_at - t0) * 1000
    extra = bench.overhead_ms if runner.reads_notes else 0.0
    return surgery, readout, Sample(None if first_token_only else ms + extra, ttft + extra, round_)


def due_again(samples: list[Sample]) -> bool:
    """Whether a strategy with these timings (of one round) is timed once more in the round."""
    return len(samples) < ROUND_SAMPLES and sum(s.ttft_ms for s in samples) < ROUND_BUDGET_MS


def _repeat(bench: Bench, case: object, runners: dict[str, Strategy],
            samples: dict[str, list[Sample]], round_: int) -> None:
    """Round-robin over the strategies still due in this round: one more timing each per pass."""
    def due(name: str) -> bool:
        return due_again([s for s in samples[name] if s.round == round_])

    while again := [name for name in runners if due(name)]:
        for name in again:
            samples[name].append(_timed(bench, runners[name], case, first_token_only=True, round_=round_)[2])


def score(bench: Bench, case: object, runners: dict[str, Strategy], outcomes: dict[str, Outcome],
          reference: str) -> None:
    """Outside the timings: how likely each strategy's notes find recompute's answer (teacher-forced
    NLL), and its prefix-cache share: the share of the prompt it sends (notes, then the question)
    that an exact-prefix serving cache already holds from the original prompt (`cached_ids`, then
    the same question), so the old prompt unchanged (stale) reads 1.0."""
    ref = outcomes[reference].readout
    answer = ref.answer_ids
    known: dict[int, float | None] = {}  # by notes: strategies with the same notes share it
    for name, out in outcomes.items():
        s = out.surgery
        key = id(s.layers) if not s.pending else None
        if ref.decision in out.readout.choice_logp and not bench.question.cot:  # read in the readout
            out.answer_nll = -out.readout.choice_logp[ref.decision] / len(answer)
        elif out.readout.answer_logp and out.readout.answer_ids == answer:  # its own answer is recompute's
            out.answer_nll = -sum(out.readout.answer_logp) / len(answer)
        elif key is not None and key in known:
            out.answer_nll = known[key]
        else:
            out.answer_nll = answer_nll(bench.engine.model, s.layers, list(s.pending) + bench.suffix_ids,
                                        answer)
        if key is not None:
            known[key] = out.answer_nll
        final = list(s.token_ids) + bench.suffix_ids  # token_ids already end with the pending ones
        held = runners[name].cached_ids(case) + bench.suffix_ids
        out.prefix_cache_share = common_prefix(held, final) / len(final)


def result_of(out: Outcome, ref: Outcome, followed: Callable[[str], str | None] = lambda answer: None,
              ) -> StrategyResult:
    """A strategy's metrics against recompute's outcome `ref`; `followed` gives an answer's
    `edit_followed` verdict (None without fields)."""
    f = fidelity(ref.readout.logits, out.readout.logits)
    low, high = out.ttft_spread
    paired, span = paired_speedups(out, ref), speedup_range(out, ref)
    detail = out.surgery.detail if out.timed else "; ".join(
        part for part in (out.surgery.detail, "decisions only: not timed") if part)
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
        detail=detail,
        picked=out.picked,
        ttft_spread_ms=[round(low, 3), round(high, 3)] if out.timed else [],
        edit_followed=followed(out.readout.decision),
        speedup=round(statistics.median(paired), 4) if paired else None,
        speedup_range=[round(span[0], 4), round(span[1], 4)] if span else [],
        choice_spread={c: [round(lo, 6), round(hi, 6)] for c, (lo, hi) in out.readout.choice_spread.items()},
        order_bias=out.readout.order_bias,
        measure_ms=round(out.readout.measure_ms, 3),
        orders_read=out.readout.orders_read if out.readout.choice_probs else 0,
        orders_total=out.readout.orders_total if out.readout.choice_probs else 0,
    )
