"""`erratum`: the old notes kept whole and a correction appended after them; only its tokens are
computed, in the readout's own forward."""

from __future__ import annotations

from vocabulary import StrategyInfo
from vocabulary.strategies import APPEND_ERRATUM, OWN_SURGERY
from worker.engine.edit import Editor, Surgery, with_erratum
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.strategies.edits.stale import stale


def erratum(editor: Editor, erratum_ids: list[int]) -> Surgery:
    return with_erratum(stale(editor), erratum_ids)


class Erratum(Strategy[EditCase]):
    info = StrategyInfo(
        name="erratum", kind="edit", rank=40,
        help="append a correction and compute only its tokens",
        recomputes="an appended correction only",
        can_defer=True, default=True, colour="#cc79a7",
        appends_errata=True,
        serving_layout=APPEND_ERRATUM, carrying=OWN_SURGERY,
    )

    def surgery(self, case: EditCase) -> Surgery:
        return erratum(case.editor, case.erratum_ids)
