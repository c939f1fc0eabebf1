"""`recompute` (compose): the reference, the whole composed prompt prefilled."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Surgery
from worker.engine.forward import extend
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.compose import BlendCase


class Recompute(Strategy[BlendCase]):
    info = StrategyInfo(
        name="recompute", kind="compose", rank=0,
        help="the reference: prefill the whole composed prompt",
        recomputes="the whole composed prompt",
        default=True, exact=True, role="reference", colour="#3d4350",
    )
    reads_notes = False

    def surgery(self, case: BlendCase) -> Surgery:
        return case.surgery(extend(case.model, None, case.ids), len(case.ids))
