"""`field_erratum`: the field refreshed in place and the correction appended (the robust default)."""

from __future__ import annotations

from vocabulary import StrategyInfo
from vocabulary.strategies import OWN_SURGERY, REFRESH_ERRATUM
from worker.engine.edit import Editor, Surgery, with_erratum
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.strategies.edits.in_place import in_place


def field_erratum(editor: Editor, erratum_ids: list[int], defer: bool = False,
                  reference: bool = False) -> Surgery:
    return with_erratum(in_place(editor, defer, reference), erratum_ids)


class FieldErratum(Strategy[EditCase]):
    info = StrategyInfo(
        name="field_erratum", kind="edit", rank=50,
        help="refresh the field and append the correction (the robust default)",
        recomputes="the changed tokens and the appended correction",
        moves_keys=True, can_defer=True, default=True, colour="#009e73",
        appends_errata=True,
        serving_layout=REFRESH_ERRATUM, carrying=OWN_SURGERY,
    )

    def surgery(self, case: EditCase) -> Surgery:
        return field_erratum(case.editor, case.erratum_ids, defer=True)

    def decision_surgery(self, case: EditCase) -> Surgery:
        """Untimed, the refreshed field read off the reference (`in_place(reference=)`)."""
        return field_erratum(case.editor, case.erratum_ids, defer=True, reference=True)
