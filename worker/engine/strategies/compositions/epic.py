"""`epic`: splice, then the first k = 16 tokens of every skill recomputed (EPIC)."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Surgery
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.compose import BlendCase


class Epic(Strategy[BlendCase]):
    info = StrategyInfo(
        name="epic", kind="compose", rank=30,
        help="splice, then the first k = 16 tokens of every skill recomputed (EPIC)",
        recomputes="the first k = 16 tokens of every skill",
        moves_keys=True, can_defer=True, colour="#44aa99",
    )

    def surgery(self, case: BlendCase) -> Surgery:
        return case.first_of_every_skill(case.epic_tokens, "EPIC")
