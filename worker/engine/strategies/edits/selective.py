"""`selective`: the field and the downstream tokens whose notes moved most, by CacheBlend's rule
(`worker.engine.selective`): decoder layer 0 is re-run over the tokens after the first change, each
reused token is scored by how far its layer-1 K/V moved, and the top fraction is recomputed in ALL
layers — never a full recompute to find them."""

from __future__ import annotations

from dataclasses import replace

from vocabulary import StrategyInfo
from vocabulary.strategies import OWN_SURGERY
from worker.engine.edit import Editor, Surgery
from worker.engine.selective import (
    SELECTION_LAYERS,
    movement,
    movement_of,
    recompute_selected,
    top_fraction,
)
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.strategies.edits.in_place import in_place


def selective(editor: Editor, fraction: float, defer: bool = False, exact: bool = False) -> Surgery:
    """The changed tokens and the top `fraction` of downstream tokens, all recomputed in one
    pass over the reused notes (the changed tokens' own old K/V are never read: selected
    positions see each other's fresh K/V only). With `defer`, that pass is the readout's. With
    `exact` (a run that times nothing, and computes the exact notes for its reference anyway), the
    ranking is read off the exact notes where they hold the very K/V its forward would compute."""
    changed = editor.changed()
    if not changed or fraction <= 0:
        return replace(in_place(editor, defer), detail=f"fraction {fraction:.0%}, nothing downstream")
    start = changed[0]
    downstream = [j for b in editor.blocks if b.reuse and b.j1 >= start for j in range(b.j1, b.j2)]
    base = editor.base()
    known = editor.exact_from(start) if exact else None
    moved = movement_of(base, known, start) if known is not None else \
        movement(editor.model, base, editor.new_ids, start)  # [T_new - start]
    ranked = top_fraction(moved, downstream, start, fraction)
    detail = (f"{len(ranked)} of {len(downstream)} downstream tokens ({fraction:.0%}), "
              f"ranked by layer-{SELECTION_LAYERS - 1} K/V movement")
    chosen = sorted(changed + ranked)
    if defer and editor.can_defer():
        return editor.deferring(base, chosen, detail)
    return editor.surgery(recompute_selected(editor.model, base, editor.new_ids, chosen), len(chosen), detail)


class Selective(Strategy[EditCase]):
    info = StrategyInfo(
        name="selective", kind="edit", rank=60,
        help="field + the downstream tokens whose notes moved most",
        recomputes="the changed tokens and the top fraction of downstream tokens whose layer-1 K/V moved "
                   "most (CacheBlend's rule)",
        moves_keys=True, can_defer=True, colour="#56b4e9",
        carrying=OWN_SURGERY,
    )

    def surgery(self, case: EditCase) -> Surgery:
        return selective(case.editor, case.selective_fraction, defer=True)

    def decision_surgery(self, case: EditCase) -> Surgery:
        """Ranked off the reference's exact notes (computed for it anyway): no forward of its own."""
        return selective(case.editor, case.selective_fraction, defer=True, exact=True)
