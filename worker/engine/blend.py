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
| selective      | splice + the `fraction` (15%) of reused tokens whose layer-1 K/V move most when |
|                | layer 0 is re-run with the real context (CacheBlend's rule)                     |
| prefix_reuse   | exact: the context and the first skill reused as a serving engine's prefix cache |
|                | holds them from an earlier prompt; everything after recomputed                  |

`prefix_reuse`'s cached notes (the context followed by the first skill, computed together) are
prepared outside the timings, as the skills themselves are compiled outside them.

The strategies are classes in `worker/engine/strategies/compositions/`, one file each; they are
timed and scored by the same measure loop as the edit strategies (`worker.engine.strategies.measure`):
from the context's notes and the compiled skills to the answer, the splice (re-rotation and the copy)
included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vocabulary import DEFAULT_COMPOSE_STRATEGIES, REFERENCE, with_recompute
from worker.engine.attention import attention_of
from worker.engine.compose import lay_out
from worker.engine.devices import describe_device, dtype_name
from worker.engine.notes import Notes
from worker.engine.strategies import COMPOSITIONS
from worker.engine.strategies.compose import BlendCase
from worker.engine.strategies.measure import Bench, measure, result_of, score
from worker.engine.types import EngineError, ProgressFn, Question, Report

if TYPE_CHECKING:
    from worker.engine.loaded import LoadedModel


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


def compose_run(engine: LoadedModel, blend: Blend,
                strategies: tuple[str, ...] | list[str] = DEFAULT_COMPOSE_STRATEGIES,
                attention: bool = False, progress: ProgressFn | None = None) -> Report:
    """Every strategy of a blend against recompute (see the module doc)."""
    report_progress = progress or (lambda stage, fraction: None)
    if len(blend.at_tokens) != len(blend.skills):
        raise EngineError(f"{len(blend.skills)} skills but {len(blend.at_tokens)} positions")
    built = COMPOSITIONS.build(with_recompute(list(strategies)))
    engine.require_portable()
    layout = lay_out(blend.context, list(blend.skills), list(blend.at_tokens))
    case = BlendCase(engine.model, blend.context, blend.skills, layout, blend.seams, blend.seam_tokens,
                     blend.epic_tokens, blend.selective_fraction)
    frame = engine.frame
    suffix = blend.suffix + frame.tail if blend.suffix is not None else frame.suffix(blend.question)
    suffix_ids = engine.encode(suffix)
    bench = Bench(engine, blend.question, suffix_ids, progress=report_progress, span=(0.05, 0.85))
    runners = COMPOSITIONS.runners(built)
    outcomes = measure(bench, case, runners)
    report_progress("compare", 0.85)
    score(bench, case, runners, outcomes, REFERENCE)
    report = Report(model=engine.info.alias, document_tokens=len(case.ids),
                    dtype=dtype_name(engine.model.dtype), device=describe_device(engine.model))
    for name, strategy in built.items():
        out = strategy.outcome(outcomes)
        report.strategies[name] = result_of(out, outcomes[REFERENCE])
        if attention:
            report.attention[name] = attention_of(engine.model, engine.tokenizer, out.surgery,
                                                  out.readout.answer_ids, suffix_ids)
    report_progress("done", 1.0)
    return report
