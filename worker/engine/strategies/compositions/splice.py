"""`splice`: full reuse, every skill's notes re-rotated into place and nothing recomputed (but
splice's own seam repair, when the run asks for one)."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Surgery
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.compose import BlendCase


class Splice(Strategy[BlendCase]):
    info = StrategyInfo(
        name="splice", kind="compose", rank=10,
        help="full reuse: every skill's notes re-rotated into place, nothing recomputed",
        recomputes="nothing (with a seam, the first tokens of every skill)",
        moves_keys=True, default=True, colour="#999933",
    )

    def surgery(self, case: BlendCase) -> Surgery:
        seams = case.seams or (0,) * len(case.skills)
        repaired = sum(min(seams[i], e - s) for i, (s, e) in zip(case.layout.order, case.layout.spans))
        return case.surgery(case.spliced(), repaired)
