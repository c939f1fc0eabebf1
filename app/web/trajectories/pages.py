"""The trajectory pages: the permalink `/trajectories/{id}` (progress k of N turns with Cancel, the
verdicts, the drift and cumulative-TTFT drawings made on the server, a table per turn), its progress
fragment, its exports (`export.json`: the one `TrajectoryView`; `export.csv`: one row per turn and
strategy), and cancel."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import SessionDep, get_or_404
from app.services.trajectories import TrajectoryView, cancel_trajectory, trajectory_view
from app.web.templating import render
from app.web.trajectories.view import csv_text, cumulative_svg, drift_svg
from data.models import RUN_ACTIVE
from data.trajectories import Trajectory

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
