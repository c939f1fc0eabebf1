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
    # by strategy, one per knockout row: masking changed the strategy's OWN unmasked decision
    changed: dict[str, list[bool]] = field(default_factory=dict)
    knockout_notes: dict[str, list[str]] = field(default_factory=dict)  # by strategy, in words
    lens_ticks: list[int] = field(default_factory=list)  # the layers numbered under the lens strips
    lens_scale: list[dict] = field(default_factory=list)  # p, colour: the lens's colour key


def own_changes(record: MechanismRecord, rows: list[KnockoutRow]) -> list[bool]:
    """Per row: whether masking changed the strategy's own decision (its unmasked one), not whether it
    differs from recompute's (a strategy that already decided otherwise is not "moved" by a mask)."""
    own = record.unmasked.get(rows[0].strategy) if rows else None
    return [row.reading is not None and own is not None and row.reading.decision != own.decision
            for row in rows]


def top_share_notes(strategy: str, rows: list[KnockoutRow], changed: list[bool]) -> list[str]:
    """"Masking the top 10% … changes the decision but the top 25% does not", per layer set."""
    by = {(row.region, row.layers): c for row, c in zip(rows, changed) if row.reading is not None}
    notes = []
    for layers in dict.fromkeys(row.layers for row in rows):
        if by.get(("downstream_top10", layers)) and by.get(("downstream_top25", layers)) is False:
            notes.append(f"Masking the top 10% of the downstream notes ({layers} layers) changes "
                         f"{strategy}'s decision, but masking the top 25% does not: the effect is not "
                         "monotone in how much is masked, so read it beside the random controls.")
    return notes


def mechanism_panel(record: MechanismRecord | None) -> MechanismPanel | None:
    if record is None:
        return None
    by_strategy: dict[str, list[KnockoutRow]] = {}
    for row in record.knockout:
        by_strategy.setdefault(row.strategy, []).append(row)
    costs = [(COST_LABELS.get(k, k), v) for k, v in record.costs.items()]
    changed = {name: own_changes(record, rows) for name, rows in by_strategy.items()}
    notes = {name: top_share_notes(name, rows, changed[name]) for name, rows in by_strategy.items()}
    strips = [_strip(name, ps) for name, ps in record.logit_lens.items() if ps]
    layers = len(strips[0].cells) if strips else 0
    return MechanismPanel(record, by_strategy, [_plot(c) for c in record.selective_k], strips, costs,
                          sum(record.costs.values()), REGION_LABELS, changed, notes, _layer_ticks(layers),
                          [{"p": p, "colour": _ramp(p)} for p in LENS_KEY])


LENS_KEY = (0.0, 0.01, 0.05, 0.25, 0.5, 1.0)  # the lens's colour key (square-root scale)


def _layer_ticks(layers: int, most: int = 8) -> list[int]:
    """The layers numbered under the lens (1-based): every k-th, the first and the last."""
    if not layers:
        return []
    step = max(1, -(-layers // most))
    return sorted({1, *range(step, layers + 1, step), layers})


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
