"""The trajectory pages: the permalink `/trajectories/{id}` (progress k of N turns with Cancel, the
verdicts, the drift and cumulative-TTFT drawings made on the server, a table per turn), its progress
fragment, its exports (`export.json`: the one `TrajectoryView`; `export.csv`: one row per turn and
strategy), cancel, and the notebook's Trajectory panel (turns as JSONL, one a line)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.services.errors import RunLimitReached, Unprocessable
from app.services.trajectories import (
    TrajectoryCreate,
    TrajectoryView,
    cancel_trajectory,
    start_trajectory,
    trajectory_view,
)
from app.web.forms import validate
from app.web.templating import render
from app.web.trajectories.view import csv_text, cumulative_svg, drift_svg
from data.models import RUN_ACTIVE, Notebook
from data.queue import QueueUnavailable
from data.settings import get_settings
from data.trajectories import Trajectory
from vocabulary import EDIT_INFO, REFERENCE
from vocabulary.trajectories import ONE_PER_FIELD, VARIANT_SEP, carried, turns_from_jsonl

router = APIRouter()


def _view(session, trajectory_id: int) -> TrajectoryView:
    return trajectory_view(session, get_or_404(session, Trajectory, trajectory_id, "trajectory"))


def _active(view: TrajectoryView) -> bool:
    return view.status in RUN_ACTIVE


@router.get("/trajectories/{trajectory_id}")
def trajectory_page(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    view = _view(session, trajectory_id)
    return render(request, "trajectory.html", trajectory=view, active=_active(view), drift=drift_svg(view),
                  cumulative=cumulative_svg(view), nav="runs")


@router.get("/trajectories/{trajectory_id}/progress")
def trajectory_progress(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    """The live fragment; once the trajectory ends, 286 (htmx stops polling) and HX-Refresh."""
    view = _view(session, trajectory_id)
    response = render(request, "_trajectory_progress.html", trajectory=view, active=_active(view))
    if not _active(view):
        response.status_code = 286
        response.headers["HX-Refresh"] = "true"
    return response


@router.post("/trajectories/{trajectory_id}/cancel")
def trajectory_cancel(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    """Cancel before the next turn (the turns read are kept); the page reloads."""
    cancel_trajectory(session, get_or_404(session, Trajectory, trajectory_id, "trajectory"))
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=204, headers={"HX-Refresh": "true"})
    return RedirectResponse(f"/trajectories/{trajectory_id}", status_code=303)


@router.get("/trajectories/{trajectory_id}/export.json")
def trajectory_json(trajectory_id: int, session: SessionDep) -> Response:
    view = _view(session, trajectory_id)
    return Response(view.model_dump_json(indent=1), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="trajectory-{view.id}.json"'})


@router.get("/trajectories/{trajectory_id}/export.csv")
def trajectory_csv(trajectory_id: int, session: SessionDep) -> Response:
    view = _view(session, trajectory_id)
    return Response(csv_text(view), media_type="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="trajectory-{view.id}.csv"'})


# ---- the notebook's Trajectory panel ------------------------------------------------------------


def _choices_of(notebook: Notebook) -> str:
    return ", ".join(notebook.question.choices) if notebook.question else ""


def _panel(request: Request, session, notebook: Notebook, errors: dict[str, str] | None = None,
           form: dict | None = None, status_code: int = 200) -> Response:
    rows = session.scalars(select(Trajectory).where(Trajectory.notebook_id == notebook.id)
                           .order_by(Trajectory.id.desc()).limit(10)).all()
    question = notebook.question
    keys = list(carried()) + [f"{n}{VARIANT_SEP}{ONE_PER_FIELD}" for n in carried()
                              if not EDIT_INFO[n].exact and EDIT_INFO[n].role == "candidate"]
    return render(request, "_trajectory_panel.html", status_code=status_code, notebook=notebook,
                  labels=[f.label for f in notebook.fields if f.label], trajectories=rows,
                  errors=errors or {},
                  form=form or {"turns": "", "question": question.text if question else "",
                                "choices": _choices_of(notebook), "strategies": list(carried())},
                  keys=keys, max_turns=get_settings().max_turns)


@router.get("/notebooks/{notebook_id}/trajectory")
def trajectory_panel(request: Request, notebook_id: int, session: SessionDep) -> Response:
    return _panel(request, session, get_or_404(session, Notebook, notebook_id, "notebook"))


@router.post("/notebooks/{notebook_id}/trajectories")
async def trajectory_start(request: Request, notebook_id: int, session: SessionDep,
                           principal: PrincipalDep) -> Response:
    """Start a trajectory from the panel's JSONL turns; on success go to its page, else the panel
    again with each problem beside its field (nothing saved)."""
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    data = await request.form()
    form = {"turns": str(data.get("turns", "")), "question": str(data.get("question", "")),
            "choices": str(data.get("choices", "")),
            "strategies": [str(s) for s in data.getlist("strategies")]}
    try:
        try:
            turns = turns_from_jsonl(form["turns"])
        except ValueError as exc:
            raise Unprocessable("turns", f"turns: {exc}") from None
        body = {"turns": [asdict(t) for t in turns], "strategies": form["strategies"] or [REFERENCE],
                "question": form["question"],
                "choices": [c.strip() for c in form["choices"].split(",") if c.strip()]}
        row = start_trajectory(session, notebook, validate(TrajectoryCreate, body), principal.name)
    except Unprocessable as exc:
        return _panel(request, session, notebook, exc.errors, form, 422)
    except QueueUnavailable as exc:
        return _panel(request, session, notebook, {"form": exc.reason}, form, 503)
    except RunLimitReached as exc:
        return _panel(request, session, notebook, {"form": str(exc)}, form, 429)
    return Response(status_code=204, headers={"HX-Redirect": f"/trajectories/{row.id}"})
