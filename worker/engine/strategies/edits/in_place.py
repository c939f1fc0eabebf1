"""`in_place`: only the changed tokens computed; the equal blocks keep their K/V, keys re-rotated
by the length change (the surgery `field_erratum` and `selective` start from, and the notes map's)."""

from __future__ import annotations

from vocabulary import StrategyInfo
from vocabulary.strategies import OWN_SURGERY, REWRITE
from worker.engine.edit import Editor, Surgery
from worker.engine.forward import extend, fresh, join_all
from worker.engine.notes import KV
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase


def in_place(editor: Editor, defer: bool = False, reference: bool = False) -> Surgery:
    """With `defer` (and a model without sliding windows) the changed tokens are left to the
    readout's forward (`Surgery.deferred`): the same K/V, one pass over the weights fewer. With
    `reference` (a run that times nothing, after the reference's notes were made), changed tokens
    the reference already computed after the same notes are read off it
    (`Editor.first_change_kv`): no forward, and nothing deferred when every change is read so."""
    changed = editor.changed()
    read = {id(b): editor.first_change_kv(b) for b in editor.blocks if not b.reuse} if reference else {}
    from_reference = bool(read) and all(kv is not None for kv in read.values())
    if defer and changed and editor.can_defer() and not from_reference:
        return editor.deferring(editor.base(), changed)
    pieces: list[list[KV]] = []
    computed = 0
    for b in editor.blocks:
        if b.reuse:
            pieces.append(editor.reused(b))
            continue
        kv = read.get(id(b))
        if kv is not None:
            pieces.append(kv)
        else:
            before = join_all(pieces)
            pieces = [before, fresh(editor.model, before, editor.new_ids[b.j1:b.j2])] if before else \
                [extend(editor.model, None, editor.new_ids[b.j1:b.j2])]
        computed += b.j2 - b.j1
    detail = ("its changed tokens' K/V read off the reference's (the same tokens after the same notes)"
              if any(kv is not None for kv in read.values()) else "")
    return editor.surgery(join_all(pieces), computed, detail)


class InPlace(Strategy[EditCase]):
    info = StrategyInfo(
        name="in_place", kind="edit", rank=30,
        help="recompute only the field's tokens; later keys re-rotated",
        recomputes="the changed tokens; equal tokens keep their K/V, keys re-rotated by the length change",
        moves_keys=True, can_defer=True, default=True, colour="#e69f00",
        serving_layout=REWRITE, carrying=OWN_SURGERY,
    )
    field_alone = True  # the notes map's and the mechanism's starting point

    def surgery(self, case: EditCase) -> Surgery:
        return in_place(case.editor, defer=True)

    def decision_surgery(self, case: EditCase) -> Surgery:
        """Untimed, the changed tokens the reference computed are read off it (`in_place(reference=)`)."""
        return in_place(case.editor, defer=True, reference=True)
