"""Attention by region as the run page draws it: a table of each strategy's shares beside the
paper's reading, a small per-layer plot per strategy (server-rendered SVG: one stacked column per
layer), and the heads whose attention moved most against recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.services.attention import (
    MovedHead,
    NoAttention,
    RegionShares,
    attention_regions,
    compare_heads,
    heads_moved_most,
    results_with_attention,
)
from app.services.errors import Unprocessable
from data.models import Run
from vocabulary import REFERENCE
from vocabulary.regions import PAPER_READING, REGION_HELP, REGIONS

REGION_LABELS = {"sink": "sink", "before_field": "before the field", "field": "field",
                 "after_field": "downstream notes", "errata": "errata", "skills": "skills",
                 "question": "question"}
# One colour per region (Okabe–Ito-like, distinct in greyscale order too).
REGION_COLOURS = {"sink": "#9aa0ab", "before_field": "#a6cee3", "field": "#d9a400", "after_field": "#1f78b4",
                  "errata": "#cc79a7", "skills": "#33a02c", "question": "#5e3c99"}

PLOT_H, PLOT_W = 64, 160  # the plot's height and its width at most, in px


def column_width(layers: int) -> int:
    """One layer's column: 4 to 14 px, so 4 layers and 40 draw about as wide."""
    return max(4, min(14, PLOT_W // max(layers, 1)))


@dataclass(frozen=True)
class Bar:
    """One region's slice of one layer's column in the per-layer plot."""

    x: int
    width: int
    y: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class RegionPlot:
    """A strategy's per-layer plot: `width` × `height` px of stacked bars."""

    strategy: str
    width: int
    height: int
    bars: list[Bar]


@dataclass(frozen=True)
class RegionsPanel:
    regions: tuple[str, ...]
    labels: dict[str, str]
    help: dict[str, str]
    colours: dict[str, str]
    shares: dict[str, RegionShares]  # recompute first
    paper: dict[str, float]
    plots: list[RegionPlot]
    moved: dict[str, list[MovedHead]]  # per strategy other than recompute


def per_layer_plot(shares: RegionShares) -> RegionPlot:
    """Each layer a column of its region shares stacked from the bottom, in `REGIONS` order."""
    bars, step = [], column_width(len(shares.per_layer))
    for layer, row in enumerate(shares.per_layer):
        bottom = float(PLOT_H)
        for region in REGIONS:
            height = row[region] * PLOT_H
            if height <= 0:
                continue
            bottom -= height
            bars.append(Bar(layer * step, step - 1, round(bottom, 2), round(height, 2),
                            REGION_COLOURS[region],
                            f"layer {layer}: {REGION_LABELS[region]} {100 * row[region]:.1f}%"))
    return RegionPlot(shares.strategy, len(shares.per_layer) * step, PLOT_H, bars)


def regions_panel(session: Session, run: Run) -> RegionsPanel | None:
    """What the run page's "by region" panel draws; None for a run without attention."""
    results = results_with_attention(session, run.id)
    try:
        shares = attention_regions(results, [(f.start, f.end) for f in run.snapshot.fields])
    except Unprocessable:  # attention and tokens that do not line up: the heatmap says why
        return None
    if not shares:
        return None
    moved = {}
    for name in shares:
        if name == REFERENCE:
            continue
        try:
            moved[name] = heads_moved_most(compare_heads(results.get(name), results.get(REFERENCE), name))
        except (NoAttention, Unprocessable):
            continue
    return RegionsPanel(REGIONS, REGION_LABELS, REGION_HELP, REGION_COLOURS, shares, PAPER_READING,
                        [per_layer_plot(s) for s in shares.values()], moved)
