"""`seam`: splice, then the first K tokens of every skill recomputed with the real prefix."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Surgery
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.compose import BlendCase


class Seam(Strategy[BlendCase]):
    info = StrategyInfo(
        name="seam", kind="compose", rank=20,
        help="splice, then the first K tokens of every skill recomputed with the real prefix (seam repair)",
        recomputes="the first K = 4 tokens of every skill",
        moves_keys=True, can_defer=True, colour="#882255",
    )

    def surgery(self, case: BlendCase) -> Surgery:
        return case.first_of_every_skill(case.seam_tokens, "seam repair")
