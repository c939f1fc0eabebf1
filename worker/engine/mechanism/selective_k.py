"""Selective@K: recompute only the fields plus the K downstream tokens ranked highest, for K = 0,
1, 2, 4, … up to all of them, and find K*: the smallest K that restores recompute's decision and
keeps it for every larger K (None when no K does).

Rankings: the notes map's patch effect (a token scores its span's share; only when the run
measured the map), recompute's attention at the decision (mean over layers and heads), the layer-1
K/V deviation `selective` ranks by (`worker.engine.selective.movement`), and a seeded random order as
the control. Every (ranking, K) is a set of positions; equal sets are measured once.

Batched: up to `BATCH` sets are recomputed in one forward over copies of the in_place notes, each
copy's chosen tokens side by side (padded to the longest set), each row seeing the notes before it
that are not chosen and the chosen rows up to its own position, at its real position — what
`recompute_in_one_pass` does for one set, windows of windowed layers applied by hand. The fresh
K/V are written into the copies, and one more forward reads the decision after each.
"""

from __future__ import annotations

import torch

from worker.engine.mechanism.masked import BATCH, Probe, batch_logits, expand, layer_masks, windowed, windows
from worker.engine.mechanism.types import Curve, KPoint, Reading
from worker.engine.notes import KV, cache_from_layers


def k_values(n: int) -> list[int]:
    """0, 1, 2, 4, … below n, then n."""
    ks, k = [0], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + ([n] if n else [])


def k_star(points: list[KPoint]) -> int | None:
    """The smallest K from which every point agrees with recompute (None when the last does not)."""
    star = None
    for p in reversed(points):
        if not p.agrees:
            break
        star = p.k
    return star


@torch.inference_mode()
def recompute_sets(model, layers: list[KV], ids: list[int], sets: list[list[int]]) -> tuple[list[KV], int]:
    """Copies of the notes `layers` ([1, kv, T, d]) with, in copy b, the positions `sets[b]`
    (sorted, non-empty) recomputed, in one forward; and the token rows it ran."""
    b, total, device = len(sets), len(ids), model.device
    width = max(len(s) for s in sets)
    pos = torch.tensor([s + [s[-1]] * (width - len(s)) for s in sets], device=device)  # pads repeat the last
    real = torch.tensor([[i < len(s) for i in range(width)] for s in sets], device=device)
    chosen = torch.zeros(b, total, dtype=torch.bool, device=device)
    for row, s in enumerate(sets):
        chosen[row, s] = True
    cols = torch.arange(total, device=device)
    sees_cache = (cols[None, None, :] < pos[:, :, None]) & ~chosen[:, None, :]  # [B, W, T]
    sees_new = (pos[:, None, :] <= pos[:, :, None]) & real[:, None, :] & real[:, :, None]  # [B, W, W]
    # a pad row sees only itself: never a row of nobody (its NaN would reach every row through 0 · NaN)
    sees_new |= torch.eye(width, dtype=torch.bool, device=device)[None] & ~real[:, :, None]
    sees = torch.cat([sees_cache, sees_new], dim=2)[:, None]
    k_pos = torch.cat([cols[None].expand(b, -1), pos], dim=1)
    masks = [windowed(sees, pos, k_pos, w) for w in windows(model)]
    cache = cache_from_layers(expand(layers, b), model)
    inputs = torch.tensor([[ids[j] for j in s] + [ids[s[-1]]] * (width - len(s)) for s in sets],
                          device=device)
    with layer_masks(model, masks):
        model(input_ids=inputs, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
    out = []
    for (k, v), layer in zip(layers, cache.layers):
        k2, v2 = k.expand(b, -1, -1, -1).clone(), v.expand(b, -1, -1, -1).clone()
        for row, s in enumerate(sets):
            index = torch.tensor(s, device=k.device)
            k2[row].index_copy_(1, index, layer.tail_keys[row, :, :len(s)])
            v2[row].index_copy_(1, index, layer.tail_values[row, :, :len(s)])
        out.append((k2, v2))
    return out, b * width


def sweep(model, probe: Probe, layers: list[KV], ids: list[int], prompt: list[int], changed: list[int],
          downstream: list[int], rankings: dict[str, list[int] | str],
          progress=None) -> tuple[list[Curve], int]:
    """One curve per ranking (a ranking is the downstream positions best first, or a line saying
    why it is missing); and the token rows run. `layers` are the in_place notes of `ids`."""
    ks = k_values(len(downstream))
    wanted = {name: [tuple(sorted(changed + order[:k])) for k in ks]
              for name, order in rankings.items() if not isinstance(order, str)}
    unique = sorted({s for sets in wanted.values() for s in sets}, key=len)
    readings, rows = {}, 0
    for i in range(0, len(unique), BATCH):
        chunk = unique[i:i + BATCH]
        if progress:
            progress(i / max(len(unique), 1))
        todo = [list(s) for s in chunk if s]
        logits = []
        if todo:
            patched, run = recompute_sets(model, layers, ids, todo)
            logits = list(batch_logits(model, patched, prompt))
            rows += run + len(todo) * len(prompt)
        if len(todo) < len(chunk):  # nothing at all recomputed: the notes as they are
            logits.insert(0, batch_logits(model, expand(layers, 1), prompt)[0])
            rows += len(prompt)
        for s, row in zip(chunk, logits):
            readings[s] = probe.read(row)
    reference = probe.decision(probe.reference)
    curves = []
    for name, order in rankings.items():
        if isinstance(order, str):
            curves.append(Curve(name, [], None, order))
            continue
        points = [KPoint(k, readings[s], readings[s].decision == reference) for k, s in zip(ks, wanted[name])]
        curves.append(Curve(name, points, k_star(points)))
    return curves, rows


def unmasked_reading(model, probe: Probe, layers: list[KV], prompt: list[int]) -> tuple[Reading, int]:
    """K = 0 without a sweep: the in_place notes `layers` as they are, read at the decision; and the
    token rows run (the prompt's)."""
    return probe.read(batch_logits(model, expand(layers, 1), prompt)[0]), len(prompt)
