"""The mechanism panel of a run (issue 27), built once from `runs.mechanism` for the run page, the
report and the presentation: knockout rows per strategy beside their random controls, the
selective@K curves drawn as SVG polylines (KL against K, each point marked by whether it keeps
recompute's decision, K* marked), and the logit lens as one strip of cells per strategy (the
server picks every colour)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from data.contracts import KCurve, KnockoutRow, MechanismRecord

REGION_LABELS = {
    "field": "the field", "downstream_top10": "downstream, top 10% by attention",
    "downstream_top25": "downstream, top 25% by attention", "downstream_top8": "downstream, top 8 positions",
    "sink": "the sink (first 4 tokens)", "errata": "the errata", "skills": "the skills",
}
RANKING_LABELS = {
    "notes_map": "the notes map's patch effect", "attention": "recompute's attention at the decision",
    "kv_deviation": "the K/V deviation selective ranks by", "random": "random order (control)",
}
COST_LABELS = {"knockout": "knockout", "selective_k": "selective@K", "logit_lens": "logit lens"}
WIDTH, HEIGHT, PAD = 320, 120, 24


@dataclass(frozen=True)
class CurvePlot:
    """One selective@K curve as the page draws it: SVG coordinates per point and K*'s x."""

    ranking: str
    label: str
    note: str
    k_star: int | None
    points: list[dict] = field(default_factory=list)  # k, x, y, kl, p, agrees, decision
    path: str = ""
    star_x: float | None = None
    kl_max: float = 0.0


@dataclass(frozen=True)
class LensStrip:
    strategy: str
    cells: list[dict]  # layer, p, colour (rgb)
    peak_layer: int
    last: float


@dataclass(frozen=True)
class MechanismPanel:
    record: MechanismRecord
    knockout: dict[str, list[KnockoutRow]]  # by strategy, recompute first
    curves: list[CurvePlot]
    lens: list[LensStrip]
    costs: list[tuple[str, float]]
    total_cost: float
    region_labels: dict[str, str]


def mechanism_panel(record: MechanismRecord | None) -> MechanismPanel | None:
    if record is None:
        return None
    by_strategy: dict[str, list[KnockoutRow]] = {}
    for row in record.knockout:
        by_strategy.setdefault(row.strategy, []).append(row)
    costs = [(COST_LABELS.get(k, k), v) for k, v in record.costs.items()]
    return MechanismPanel(record, by_strategy, [_plot(c) for c in record.selective_k],
                          [_strip(name, ps) for name, ps in record.logit_lens.items() if ps], costs,
                          sum(record.costs.values()), REGION_LABELS)


def _plot(curve: KCurve) -> CurvePlot:
    label = RANKING_LABELS.get(curve.ranking, curve.ranking)
    if not curve.points:
        return CurvePlot(curve.ranking, label, curve.note, curve.k_star)
    kl_max = max((p.reading.kl for p in curve.points if math.isfinite(p.reading.kl)), default=0.0) or 1e-9
    n = len(curve.points)
    points = []
    for i, p in enumerate(curve.points):
        x = PAD + (WIDTH - 2 * PAD) * (i / max(n - 1, 1))
        kl = p.reading.kl if math.isfinite(p.reading.kl) else kl_max
        y = PAD / 2 + (HEIGHT - 1.5 * PAD) * (1 - kl / kl_max)
        points.append({"k": p.k, "x": round(x, 1), "y": round(y, 1), "kl": p.reading.kl,
                       "p": p.reading.p_answer, "agrees": p.agrees, "decision": p.reading.decision})
    star = next((pt["x"] for pt in points if pt["k"] == curve.k_star), None)
    path = " ".join(f"{pt['x']},{pt['y']}" for pt in points)
    return CurvePlot(curve.ranking, label, curve.note, curve.k_star, points, path, star, kl_max)


def _strip(strategy: str, ps: list[float]) -> LensStrip:
    cells = [{"layer": i + 1, "p": p, "colour": _ramp(p)} for i, p in enumerate(ps)]
    return LensStrip(strategy, cells, max(range(len(ps)), key=lambda i: ps[i]) + 1, ps[-1])


def _ramp(p: float) -> str:
    """White (p = 0) to deep blue (p = 1), on a square-root scale so small probabilities show."""
    t = math.sqrt(min(max(p, 0.0), 1.0))
    r, g, b = (round(255 + (c - 255) * t) for c in (29, 78, 216))
    return f"rgb({r}, {g}, {b})"
