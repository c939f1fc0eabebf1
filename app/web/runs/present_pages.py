"""Presentation mode: one run told in four steps, full screen, large type, dark or light —
the document and the edit → what each strategy decided → where the decision looked, against
recompute → which notes carry it. Every step has its own URL (`/runs/{id}/present/{step}`,
the view of step 3 following `?strategy=…` like the run page); arrow keys, clicks and the
links move between them (`static/js/present.js`), and without scripts the links still do."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from markupsafe import Markup

from app.api.deps import SessionDep, get_or_404
from app.web.runs.context import ViewDep, checked_view, run_context
from app.web.runs.heatmap_view import dark_css, div_stops, heatmap_panels, hex_colour, seq_stops
from app.web.templating import render
from data.models import Run

router = APIRouter()

STEPS = (
    ("edit", "The document and the edit"),
    ("decisions", "What each strategy decided"),
    ("attention", "Where the decision looked, against recompute"),
    ("notes", "Which notes carry the decision"),
)


@router.get("/runs/{run_id}/present")
def present_start(request: Request, run_id: int, session: SessionDep, asked: ViewDep) -> Response:
    return present(request, run_id, 1, session, asked)


@router.get("/runs/{run_id}/present/{step}")
def present(request: Request, run_id: int, step: int, session: SessionDep, asked: ViewDep) -> Response:
    if not 1 <= step <= len(STEPS):
        raise HTTPException(
            status_code=404, detail=f"a presentation has steps 1 to {len(STEPS)}; there is no step {step}"
        )
    run = get_or_404(session, Run, run_id, "run")
    context = run_context(session, run)
    view = checked_view(run, context, asked)
    panels = heatmap_panels(session, run.id, view) if view else None
    fields = run.snapshot.fields
    return render(
        request, "present.html", **context, view=view, panels=panels, step=step, steps=STEPS,
        query=("?" + view.query_string()) if view and asked.strategy else "",
        first_field=fields[0].start if fields else None,
        seq_ramp=[hex_colour(c) for c in seq_stops()], div_ramp=[hex_colour(c) for c in div_stops()],
        dark_css=Markup(dark_css()),  # generated from the stylesheet's colours, no outside text
    )
