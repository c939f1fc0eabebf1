"""Knockout: mask the decision token's attention to one region of the notes, in every layer or in
one third of them, and read the decision again — beside a random control of the same size.

The regions are the paper's: the fields, the downstream notes (the top 10% and 25% of them by this
cache's own attention at the decision, and the top 8 positions), the sink (the first 4 tokens), the
errata and the skills; the top 25% is also knocked out in the early, middle and late third of the
layers alone. Only the decision row is masked: every question token before it reads the notes as
before. A control masks `DRAWS` random sets of the same size instead, drawn from a seeded generator
from the same downstream notes (less the region) for a downstream row, and from the other cached notes
(the sink and the question left out) for the others.
"""

from __future__ import annotations

import math
import statistics

import torch

from vocabulary.regions import Span, token_regions
from worker.engine.mechanism.masked import Probe, prompt_logits
from worker.engine.mechanism.types import Control, KnockoutRow, Reading
from worker.engine.notes import KV

DRAWS = 5  # random control sets per row
TOP_POSITIONS = 8
SHARES = (0.10, 0.25)
THIRDS = ("early", "middle", "late")
NOTES = ("before_field", "field", "after_field", "errata", "skills")  # what a control may mask
EMPTY = {
    "field": "no field changed in this run",
    "errata": "no errata in these notes",
    "skills": "no skills placed in this run",
    "downstream": "no downstream notes after the field in this run",
    "sink": "no sink tokens",
}


def thirds(n_layers: int) -> dict[str, list[int]]:
    """The decoder layers in three contiguous thirds (a model of two layers has no middle one)."""
    return {name: [i for i in range(n_layers) if i * 3 // n_layers == t] for t, name in enumerate(THIRDS)}


def draw(pool: list[int], size: int, generator: torch.Generator) -> list[int]:
    """`size` positions of `pool` at random (all of them when the pool is smaller)."""
    order = torch.randperm(len(pool), generator=generator).tolist()
    return sorted(pool[i] for i in order[:size])


def regions_of(segments: list[str], offsets: list[tuple[int, int]], prompt_len: int,
               fields: list[tuple[int, int]]) -> list[str]:
    """The region of every position the decision can see: the cached notes and pending tokens
    (`segments`, `offsets`), then the question's `prompt_len` tokens."""
    spans = [Span(o[0], o[1], s) for s, o in zip(segments, offsets)]
    spans += [Span(-1, -1, "question")] * prompt_len
    return token_regions(spans, fields)


def plan(regions: list[str], attention: torch.Tensor, n_layers: int,
         generator: torch.Generator) -> list[tuple[str, str, list[int], list[int], list[list[int]]]]:
    """The rows to measure: (region, layers, the layer indexes, the positions, control draws).
    `attention` is this cache's decision attention per position [T], mean over layers and heads."""
    where = {r: [i for i, x in enumerate(regions) if x == r] for r in set(regions)}
    down = where.get("after_field", [])
    ranked = sorted(down, key=lambda j: (-float(attention[j]), j))
    every = list(range(n_layers))
    rows: list[tuple[str, str, list[int], list[int]]] = [("field", "all", every, where.get("field", []))]
    for share in SHARES:
        top = ranked[:math.ceil(share * len(down))]
        rows.append((f"downstream_top{round(share * 100)}", "all", every, top))
    rows.append((f"downstream_top{TOP_POSITIONS}", "all", every, ranked[:TOP_POSITIONS]))
    rows += [("sink", "all", every, where.get("sink", [])), ("errata", "all", every, where.get("errata", [])),
             ("skills", "all", every, where.get("skills", []))]
    top25 = ranked[:math.ceil(SHARES[1] * len(down))]
    rows += [("downstream_top25", name, idx, top25) for name, idx in thirds(n_layers).items()]
    notes = [i for i, r in enumerate(regions) if r in NOTES]
    out = []
    for region, layers, idx, positions in rows:
        chosen = set(positions)
        pool = [j for j in (down if region.startswith("downstream") else notes) if j not in chosen]
        draws = [draw(pool, len(positions), generator) for _ in range(DRAWS)] if positions and idx else []
        out.append((region, layers, idx, positions, draws))
    return out


def knockout(model, probe: Probe, strategy: str, layers: list[KV], prompt: list[int], regions: list[str],
             attention: torch.Tensor, generator: torch.Generator) -> tuple[Reading, list[KnockoutRow], int]:
    """This strategy's knockout rows (`layers` its completed notes, `prompt` its pending tokens and
    the question), the unmasked reading first, and the token rows it ran through the model."""
    n_layers, total = len(layers), len(regions)

    def blocked(positions: list[int], idx: list[int]) -> list[torch.Tensor | None]:
        mask = torch.zeros(total, dtype=torch.bool)
        mask[positions] = True
        return [mask if i in idx else None for i in range(n_layers)]

    rows = plan(regions, attention, n_layers, generator)
    variants = [[None] * n_layers]
    for _region, _layers, idx, positions, draws in rows:
        if positions and idx:
            variants += [blocked(positions, idx)] + [blocked(d, idx) for d in draws]
    readings = [probe.read(row) for row in prompt_logits(model, layers, prompt, variants)]
    unmasked, reference = readings[0], probe.decision(probe.reference)
    out, at = [], 1
    for region, layer_name, idx, positions, draws in rows:
        row = KnockoutRow(strategy, region, layer_name, len(positions))
        if not positions:
            row.note = EMPTY["downstream" if region.startswith("downstream") else region]
        elif not idx:
            row.note = f"this model has too few layers for a {layer_name} third"
        else:
            row.reading = readings[at]
            row.agrees = row.reading.decision == reference
            row.control = _control(readings[at + 1:at + 1 + len(draws)], len(draws[0]), reference)
            at += 1 + len(draws)
        out.append(row)
    return unmasked, out, len(prompt) - 1 + len(variants)


def _control(readings: list[Reading], size: int, reference: str) -> Control:
    ps, kls = [r.p_answer for r in readings], [r.kl for r in readings]
    spread = statistics.pstdev if len(readings) > 1 else (lambda xs: 0.0)
    return Control(size, len(readings), statistics.fmean(ps), spread(ps), statistics.fmean(kls), spread(kls),
                   sum(r.decision == reference for r in readings) / len(readings))
