"""What every edit strategy reads (`EditCase`: a field of a document whose notes are cached
changes), and auto's summed timings. The strategies themselves are one file each in
`worker/engine/strategies/edits/`: the class with its descriptor and its algorithm, built from the
run's `Editor` (`worker.engine.edit`, the shared surgery).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from worker.engine.edit import Editor, Surgery
from worker.engine.offsets import Insertions
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.measure import Outcome, Sample
from worker.engine.types import Field

if TYPE_CHECKING:
    from worker.engine.loaded import LoadedModel


@dataclass
class EditCase:
    """What every edit strategy reads: the editor (old notes, new tokens), the erratum's tokens and
    the knobs; for strategies that lay the text out again (hoist), the composed text, the fields in
    its offsets and the skills inserted into it."""

    engine: LoadedModel
    editor: Editor
    erratum_ids: list[int]
    cached_ids: list[int]  # the original notes' tokens (skills placed): what a prefix cache holds
    composed_text: str = ""
    fields: list[Field] = field(default_factory=list)  # in the composed text's offsets
    inserts: Insertions = field(default_factory=Insertions)
    selective_fraction: float = 0.15


def complete_notes(strategy: Strategy, editor: Editor) -> Surgery:
    """The notes `strategy` makes of `editor`'s change, complete (nothing deferred to a readout, no
    erratum): what an analysis reads (the notes map, the mechanism) of the strategies it starts from
    (the reference, the field alone, the floor), which read only the editor, never the engine."""
    case = EditCase(engine=cast("LoadedModel", None), editor=editor.eager(), erratum_ids=[],
                    cached_ids=list(editor.old.token_ids))
    return strategy.surgery(case)


def _summed(probes: list[Outcome], chosen: Outcome) -> list[Sample]:
    """Auto's timings, one sample per timing round (so its speed-ups pair with recompute's round by
    round): every probe's latency summed, with each probe's first token as timed in that round, and
    its first token after all of them but its pick's decoding."""
    decode = chosen.latency_ms - chosen.ttft_ms
    rounds = [p.round_ttft() for p in probes]
    common = sorted(set.intersection(*(set(r) for r in rounds)))
    totals = [sum(p.latency_ms - p.ttft_ms + r[n] for p, r in zip(probes, rounds)) for n in common]
    return [Sample(total, total - decode, n) for total, n in zip(totals, common)]
