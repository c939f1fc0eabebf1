"""`recompute`: the reference, every token of the new text prefilled again (the oracle every
strategy is measured against).

When nothing is timed (a sweep's decision-only edit) its notes are computed exactly from the first
change on (`Editor.from_first_change`): the notes before the field are the same cache, token for
token at the same positions, so the reference is the same and costs what prefix_reuse costs. Its
`tokens_computed` stays every token (what recompute costs), and a timed run checks the shortcut
against the true recompute (`worker.engine.run`, KL at most `EXACT_KL`)."""

from __future__ import annotations

from dataclasses import replace

from vocabulary import StrategyInfo
from vocabulary.strategies import WHOLE_PROMPT
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
        carrying=WHOLE_PROMPT,
    )
    reads_notes = False

    def surgery(self, case: EditCase) -> Surgery:
        return recompute(case.editor)

    def decision_surgery(self, case: EditCase) -> Surgery:
        exact = case.editor.from_first_change()
        return replace(exact, tokens_computed=len(case.editor.new_ids),
                       detail=f"computed exactly from the first change on ({exact.tokens_computed} tokens; "
                              "the notes before it are the same cache)")
