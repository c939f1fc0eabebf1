"""`prefix_reuse` (compose): exact, the context and the first skill reused as a prefix cache holds
them (prepared outside the timings, as the skills are compiled outside them), the rest recomputed."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Surgery
from worker.engine.forward import cut, extend
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.compose import BlendCase


class PrefixReuse(Strategy[BlendCase]):
    info = StrategyInfo(
        name="prefix_reuse", kind="compose", rank=50,
        help="exact: the context and the first skill reused as a prefix cache holds them, the rest "
             "recomputed",
        recomputes="everything after the first skill",
        exact=True, colour="#0072b2",
    )

    def prepare(self, case: BlendCase) -> None:
        start, end = case.layout.first_skill
        before = cut(case.context.layers, 0, start) if start else None
        self.exact = extend(case.model, before, case.ids[start:end])

    def surgery(self, case: BlendCase) -> Surgery:
        end = case.layout.first_skill[1]
        return case.surgery(extend(case.model, self.exact, case.ids[end:]), len(case.ids) - end)
