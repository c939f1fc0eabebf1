"""`prefix_reuse`: what a serving engine's prefix cache does, exact: the notes up to the first
change kept, every token from there on computed again."""

from __future__ import annotations

from vocabulary import StrategyInfo
from vocabulary.prefix import common_prefix
from vocabulary.strategies import WHOLE_PROMPT
from worker.engine.edit import Editor, Surgery
from worker.engine.forward import cut, extend
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase


def prefix_reuse(editor: Editor) -> Surgery:
    p = min(common_prefix(editor.old.token_ids, editor.new_ids), len(editor.new_ids))
    layers = extend(editor.model, cut(editor.old.layers, 0, p), editor.new_ids[p:])
    return editor.surgery(layers, len(editor.new_ids) - p)


class PrefixReuse(Strategy[EditCase]):
    info = StrategyInfo(
        name="prefix_reuse", kind="edit", rank=10,
        help="recompute from the first field to the end (exact, what a prefix cache does)",
        recomputes="every token from the first change on",
        default=True, exact=True, colour="#0072b2",
        carrying=WHOLE_PROMPT,
    )

    def surgery(self, case: EditCase) -> Surgery:
        return prefix_reuse(case.editor)

    def decision_surgery(self, case: EditCase) -> Surgery:
        """The same exact notes, shared with the reference's when both decide untimed."""
        return case.editor.from_first_change()
