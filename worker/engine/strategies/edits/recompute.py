"""`recompute`: the reference, every token of the new text prefilled again (the oracle every
strategy is measured against)."""

from __future__ import annotations

from vocabulary import StrategyInfo
from worker.engine.edit import Editor, Surgery
from worker.engine.forward import extend
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase


def recompute(editor: Editor) -> Surgery:
    return editor.surgery(extend(editor.model, None, editor.new_ids), len(editor.new_ids))


class Recompute(Strategy[EditCase]):
    info = StrategyInfo(
        name="recompute", kind="edit", rank=0,
        help="the reference: prefill everything again",
        recomputes="every token (the oracle)",
        default=True, exact=True, role="reference", colour="#3d4350",
    )
    reads_notes = False

    def surgery(self, case: EditCase) -> Surgery:
        return recompute(case.editor)
