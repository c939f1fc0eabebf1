"""Trajectories of a notebook: start one (checked first: a 422 naming the turn and nothing saved,
429 past the caps, 503 when the broker cannot take it), list a notebook's, read one (the service's
`TrajectoryView`: per turn every strategy's result, per strategy a summary and a verdict), cancel one."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.services.trajectories import (
    TrajectoryCreate,
    TrajectoryView,
    cancel_trajectory,
    start_trajectory,
    trajectory_view,
)
from data.models import Notebook
from data.queue import QueueUnavailable
from data.trajectories import Trajectory

router = APIRouter(tags=["trajectories"])


@router.post("/notebooks/{notebook_id}/trajectories", response_model=TrajectoryView,
             status_code=status.HTTP_201_CREATED, responses=errors(404, 413, 429, 503))
def create_trajectory(notebook_id: int, body: TrajectoryCreate, session: SessionDep,
                      principal: PrincipalDep) -> TrajectoryView:
    """Run the turns on the notebook's document and fields, every strategy carrying its own cache."""
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    try:
        row = start_trajectory(session, notebook, body, principal.name)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return trajectory_view(session, row)


@router.get("/notebooks/{notebook_id}/trajectories", response_model=list[TrajectoryView],
            responses=errors(404))
def list_trajectories(notebook_id: int, session: SessionDep,
                      limit: int = Query(default=20, ge=1, le=200,
                                         description="at most this many, newest first"),
                      ) -> list[TrajectoryView]:
    get_or_404(session, Notebook, notebook_id, "notebook")
    rows = session.scalars(select(Trajectory).where(Trajectory.notebook_id == notebook_id)
                           .order_by(Trajectory.id.desc()).limit(limit))
    return [trajectory_view(session, row) for row in rows]


@router.get("/trajectories/{trajectory_id}", response_model=TrajectoryView, responses=errors(404))
def read_trajectory(trajectory_id: int, session: SessionDep) -> TrajectoryView:
    return trajectory_view(session, get_or_404(session, Trajectory, trajectory_id, "trajectory"))


@router.post("/trajectories/{trajectory_id}/cancel", response_model=TrajectoryView,
             responses=errors(404, 409))
def cancel(trajectory_id: int, session: SessionDep) -> TrajectoryView:
    """Stop a queued or running trajectory before its next turn; the turns read are kept."""
    row = get_or_404(session, Trajectory, trajectory_id, "trajectory")
    if not cancel_trajectory(session, row):
        raise HTTPException(status_code=409, detail=f"trajectory {trajectory_id} already {row.status}")
    return trajectory_view(session, row)
