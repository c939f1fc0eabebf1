"""`selective` (compose): splice, then the reused tokens whose first-layer K/V move most
recomputed (CacheBlend)."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Surgery
from worker.engine.selective import movement, top_fraction
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.compose import BlendCase


class Selective(Strategy[BlendCase]):
    info = StrategyInfo(
        name="selective", kind="compose", rank=40,
        help="splice, then the 15% of reused tokens whose first-layer K/V move most recomputed (CacheBlend)",
        recomputes="the 15% of reused tokens whose layer-1 K/V move most",
        moves_keys=True, can_defer=True, colour="#56b4e9",
    )

    def surgery(self, case: BlendCase) -> Surgery:
        start = case.layout.first_skill[0]
        spliced = case.spliced()
        candidates = list(range(start, len(case.ids)))
        fraction = case.selective_fraction
        chosen = top_fraction(movement(case.model, spliced, case.ids, start), candidates, start, fraction)
        detail = (f"{len(chosen)} of {len(candidates)} reused tokens ({fraction:.0%}), "
                  "ranked by layer-1 K/V movement")
        return case.recomputed(spliced, chosen, detail)
