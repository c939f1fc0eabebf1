"""`/_components`: every UI component on one page with made-up data (a Datasette habit), so a
change to the stylesheet can be checked at a glance."""

from __future__ import annotations

from types import SimpleNamespace as NS

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.web.notebooks.document_view import build_document_view
from app.web.templating import render
from data.models import RUN_FINISHED

router = APIRouter()

DOC = "Account record\n\nstatus: active\nowner: Dana Lee\n\nOnly accounts whose status is active may log in."


def _run(ident: int, status: str, stage: str, progress: float, error: str | None = None) -> NS:
    return NS(id=ident, status=status, stage=stage, progress=progress, error=error, model="smollm2-135m",
              is_finished=status in RUN_FINISHED)


@router.get("/_components")
def components(request: Request) -> Response:
    field = NS(id=1, start=24, end=30, old_value="active", new_value="suspended", label="status",
               notebook_id=1)
    skill = NS(id=1, name="one-word answers", text="Answer with one word.", token_count=7, compile_ms=84.0)
    placement = NS(id=1, position=None, skill=skill)
    notebook = NS(id=0, model="smollm2-135m", fields=[field], placements=[placement], title="Gallery",
                  errata=[NS(id=1, text="[STATE UPDATE] status has changed from active to suspended.",
                             source="generated")],
                  document=DOC)
    runs = [_run(1, "queued", "queued", 0.0), _run(2, "running", "prefill", 0.45),
            _run(3, "succeeded", "done", 1.0),
            _run(4, "failed", "readout", 0.7, "CUDA out of memory (example)"),
            _run(5, "cancelled", "cancelled", 0.3)]
    return render(
        request, "components.html", notebook=notebook, view=build_document_view(DOC, [field], [placement]),
        runs=runs, skills=[skill], question=None, values={},
        errors={"label": "label: at most 200 characters"},
        recent_runs=[], compact=True, gallery=True,
    )
