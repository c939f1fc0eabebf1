"""Blend: a context composed from many precompiled skills, and what each strategy pays for it.

Each skill was prefilled once on its own (after its sink). Composing re-rotates every skill into
place and lays the pieces end to end with one copy per layer (`compose.splice_all`). The composed
prompt is the context's tokens with every skill's tokens (sink dropped) at its place; `recompute`
prefills exactly these tokens, so every strategy reads the same sequence, then the same suffix.

| strategy       | recomputed                                                                      |
| recompute      | the whole composed prompt (the oracle)                                          |
| splice         | nothing: full reuse (with `seam` > 0, the first `seam` tokens of every skill)   |
| seam           | splice + the first `seam_tokens` (K = 4, the paper's seam repair) of every skill |
| epic           | splice + the first `epic_tokens` (k = 16) of every skill (EPIC)                 |
| selective      | splice + the `fraction` (15%) of reused tokens whose layer-1 K/V move most when layer 0 is re-run with the real context (CacheBlend's rule) |
| prefix_reuse   | exact: the context and the first skill reused as a serving engine's prefix cache holds them from an earlier prompt; everything after recomputed |

`prefix_reuse`'s cached notes (the context followed by the first skill, computed together) are
prepared outside the timings, as the skills themselves are compiled outside them.

Timing as in `worker.engine.run`: each strategy is timed in this process after a warm-up, from the
context's notes and the compiled skills to its answer: the splice (re-rotation and the copy), its
own recompute, and the readout; `ttft_ms` ends when the first answer token's logits are ready.
`seam`, `epic` and `selective` leave their tokens to the readout's forward (`forward.Deferred`) on
models without sliding windows: the same K/V, one pass over the weights fewer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from vocabulary import unknown_compose_strategies, with_recompute
from worker.engine.compose import Layout, lay_out, splice_all
from worker.engine.edit import Surgery
from worker.engine.forward import Deferred, cut, extend
from worker.engine.notes import KV, Notes, cache_from_layers
from worker.engine.readout import answer_nll, decide
from worker.engine.run import Engine, Outcome, _attention, result_of
from worker.engine.selective import has_sliding_window, movement, recompute_selected, top_fraction
from worker.engine.types import EngineError, ProgressFn, Question, Report


@dataclass(frozen=True)
class Blend:
    """A composition to measure: the context, its skills, where each goes, and the knobs."""

    context: Notes
    skills: tuple[Notes, ...]
    at_tokens: tuple[int, ...]  # skill i goes before context token at_tokens[i]
    question: Question
    suffix: str | None = None  # exact text after the composed prompt (None: the frame's question)
    seams: tuple[int, ...] = ()  # `splice`'s own seam repair per skill (0 = none)
    seam_tokens: int = 4
    epic_tokens: int = 16
    selective_fraction: float = 0.15


@dataclass(frozen=True)
class Way:
    """One strategy's notes for a blend, before the readout: `deferred` tokens (if any) are computed
    in the readout's own forward."""

    layers: list[KV]
    computed: int
    detail: str = ""
    deferred: Deferred | None = None


def _first_tokens(layout: Layout, k: int) -> list[int]:
    return [j for start, end in layout.spans for j in range(start, min(end, start + k))]


class _Strategies:
    """Each strategy's notes for one blend, from the context and the compiled skills."""

    def __init__(self, engine: Engine, blend: Blend, layout: Layout):
        self.engine, self.blend, self.layout = engine, blend, layout
        self.model = engine.model
        self.ids = list(layout.token_ids)
        self.exact = None  # prefix_reuse's cached prefix, prepared outside the timings

    def prepare_prefix(self) -> None:
        start, end = self.layout.first_skill
        self.exact = extend(self.model, cut(self.blend.context.layers, 0, start) if start else None,
                            self.ids[start:end])

    def _spliced(self) -> list[KV]:
        b = self.blend
        return splice_all(self.model, b.context, list(b.skills), self.layout, list(b.seams) or None).layers

    def recompute(self) -> Way:
        return Way(extend(self.model, None, self.ids), len(self.ids))

    def splice(self) -> Way:
        seams = self.blend.seams or (0,) * len(self.blend.skills)
        repaired = sum(min(seams[i], e - s) for i, (s, e) in zip(self.layout.order, self.layout.spans))
        return Way(self._spliced(), repaired)

    def _recomputed(self, spliced: list[KV], chosen: list[int], detail: str) -> Way:
        """`spliced` with the `chosen` tokens recomputed: left to the readout's forward (deferred)
        where one mask can carry the model's attention, else in a forward of their own."""
        if not chosen or has_sliding_window(self.model):
            return Way(recompute_selected(self.model, spliced, self.ids, chosen), len(chosen), detail)
        return Way(spliced, len(chosen), detail, Deferred(tuple(chosen), tuple(self.ids[j] for j in chosen)))

    def _first_of_every_skill(self, k: int, what: str) -> Way:
        return self._recomputed(self._spliced(), _first_tokens(self.layout, k), f"the first {k} tokens of every skill ({what})")

    def seam(self) -> Way:
        return self._first_of_every_skill(self.blend.seam_tokens, "seam repair")

    def epic(self) -> Way:
        return self._first_of_every_skill(self.blend.epic_tokens, "EPIC")

    def selective(self) -> Way:
        start = self.layout.first_skill[0]
        spliced = self._spliced()
        candidates = list(range(start, len(self.ids)))
        fraction = self.blend.selective_fraction
        chosen = top_fraction(movement(self.model, spliced, self.ids, start), candidates, start, fraction)
        detail = f"{len(chosen)} of {len(candidates)} reused tokens ({fraction:.0%}), ranked by layer-1 K/V movement"
        return self._recomputed(spliced, chosen, detail)

    def prefix_reuse(self) -> Way:
        end = self.layout.first_skill[1]
        return Way(extend(self.model, self.exact, self.ids[end:]), len(self.ids) - end)


def compose_run(engine: Engine, blend: Blend, strategies: tuple[str, ...] | list[str] = ("splice",),
                attention: bool = False, progress: ProgressFn | None = None) -> Report:
    """Every strategy of a blend against recompute (see the module doc)."""
    report_progress = progress or (lambda stage, fraction: None)
    problem = unknown_compose_strategies(list(strategies))
    if problem:
        raise EngineError(problem)
    if len(blend.at_tokens) != len(blend.skills):
        raise EngineError(f"{len(blend.skills)} skills but {len(blend.at_tokens)} positions")
    names = with_recompute(list(strategies))
    engine.require_portable()
    layout = lay_out(blend.context, list(blend.skills), list(blend.at_tokens))
    ways = _Strategies(engine, blend, layout)
    if "prefix_reuse" in names:
        ways.prepare_prefix()
    frame = engine.frame
    suffix_ids = engine.encode(blend.suffix + frame.tail if blend.suffix is not None else frame.suffix(blend.question))
    engine.warm_up()
    outcomes: dict[str, Outcome] = {}
    for i, name in enumerate(names):
        report_progress(f"compose: {name}", 0.05 + 0.8 * i / len(names))
        way_of: Callable[[], Way] = getattr(ways, name)
        t0 = time.perf_counter()
        way = way_of()
        readout = decide(engine.model, engine.tokenizer, frame, cache_from_layers(way.layers, engine.model),
                         suffix_ids, blend.question, deferred=way.deferred)
        surgery = Surgery(way.layers, list(ways.ids), list(layout.segments), list(layout.offsets), way.computed,
                          way.detail, deferred=way.deferred).completed(readout.deferred_kv)
        ms, ttft = (time.perf_counter() - t0) * 1000, (readout.first_token_at - t0) * 1000
        outcomes[name] = Outcome(surgery, readout, ms, ttft)
    report_progress("compare", 0.85)
    ref = outcomes["recompute"]
    cached = layout.first_skill[1]
    for out in outcomes.values():  # outside the timings
        out.answer_nll = answer_nll(engine.model, out.surgery.layers, suffix_ids, ref.readout.answer_ids)
        out.prefix_cache_share = cached / (len(ways.ids) + len(suffix_ids))
    report = Report(model=engine.info.alias, document_tokens=len(ways.ids))
    for name in names:
        report.strategies[name] = result_of(outcomes[name], ref)
        if attention:
            report.attention[name] = _attention(engine, outcomes[name], suffix_ids)
    report_progress("done", 1.0)
    return report
