"""`stale`: the floor, nothing recomputed: the model acts on the old notes of the old text."""

from __future__ import annotations

from vocabulary import StrategyInfo
from vocabulary.strategies import OWN_SURGERY
from worker.engine.edit import Editor, Surgery
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase


def stale(editor: Editor) -> Surgery:
    o = editor.old
    return Surgery(o.layers, list(o.token_ids), list(o.segments), list(o.offsets), 0)


class Stale(Strategy[EditCase]):
    info = StrategyInfo(
        name="stale", kind="edit", rank=20,
        help="recompute nothing: the floor, the model acts on the old notes",
        recomputes="nothing",
        default=True, role="floor", colour="#d55e00",
        carrying=OWN_SURGERY,
    )

    def surgery(self, case: EditCase) -> Surgery:
        return stale(case.editor)
