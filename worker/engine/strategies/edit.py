"""The edit strategies: a field of a document whose notes are cached changes; each class says what
it recomputes (its descriptor, `vocabulary.EDIT_INFO`) and gets its notes from the run's `Editor`
(`worker.engine.edit`, the surgery itself). `auto` is a composite: it runs no surgery of its own but
picks among its parts' outcomes. `hoist` lives in `worker.engine.strategies.hoist`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from vocabulary import EDIT_INFO
from worker.engine.compare import same_answer
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


class Recompute(Strategy[EditCase]):
    info = EDIT_INFO["recompute"]
    reads_notes = False

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.recompute()


class PrefixReuse(Strategy[EditCase]):
    info = EDIT_INFO["prefix_reuse"]

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.prefix_reuse()


class Stale(Strategy[EditCase]):
    info = EDIT_INFO["stale"]

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.stale()


class InPlace(Strategy[EditCase]):
    info = EDIT_INFO["in_place"]

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.in_place(defer=True)


class Erratum(Strategy[EditCase]):
    info = EDIT_INFO["erratum"]

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.erratum(case.erratum_ids)


class FieldErratum(Strategy[EditCase]):
    info = EDIT_INFO["field_erratum"]

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.field_erratum(case.erratum_ids, defer=True)


class Selective(Strategy[EditCase]):
    info = EDIT_INFO["selective"]

    def surgery(self, case: EditCase) -> Surgery:
        return case.editor.selective(case.selective_fraction, defer=True)


class Auto(Strategy[EditCase]):
    """The cheapest part whose decision matches field_erratum's (the robust default); its cost is
    every probe it had to run, field_erratum's included, honestly summed."""

    info = EDIT_INFO["auto"]
    TARGET = "field_erratum"

    def needs(self) -> tuple[str, ...]:
        return (self.TARGET, *self.info.parts)

    def outcome(self, outcomes: dict[str, Outcome]) -> Outcome:
        target = outcomes[self.TARGET].readout.decision
        probes = sorted(self.info.parts, key=lambda n: outcomes[n].surgery.tokens_computed)
        picked, spent = self.TARGET, []
        for name in probes:
            spent.append(outcomes[name])
            if same_answer(outcomes[name].readout.decision, target):
                picked = name
                break
        spent.append(outcomes[self.TARGET])
        chosen = outcomes[picked]
        surgery = replace(chosen.surgery, detail=f"picked {picked}")  # for people; `picked` is the fact
        return Outcome(surgery, chosen.readout, _summed(spent, chosen), chosen.answer_nll,
                       chosen.prefix_cache_share, picked=picked)


def _summed(probes: list[Outcome], chosen: Outcome) -> list[Sample]:
    """Auto's timings as three samples (fastest, median, slowest): every probe's latency summed, and
    its first token after all of them but its pick's decoding."""
    decode = chosen.latency_ms - chosen.ttft_ms

    def summed(pick) -> float:  # a probe's decoding is its first run's; its first token varies
        return sum(p.latency_ms - p.ttft_ms + pick(s.ttft_ms for s in p.samples) for p in probes)

    totals = [summed(min), sum(p.latency_ms for p in probes), summed(max)]
    return [Sample(total, total - decode) for total in totals]
