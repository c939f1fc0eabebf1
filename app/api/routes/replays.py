"""Serving replays on a vLLM server, of a notebook's field edit or of a trajectory (one request per
turn): start one (checked first: a 422 naming the problem, or the turn, and nothing saved, or 503
when the broker cannot take it), list a notebook's or a trajectory's, read one with its result, and
cancel one (docs/serving.md, docs/trajectories.md)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, status

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import ReplayCreate, ReplayOut, TrajectoryReplayCreate
from app.services.replays import (
    at_the_keyboard,
    cancel_replay,
    replays_of,
    replays_of_trajectory,
    start_replay,
    start_trajectory_replay,
)
from data.models import Notebook
from data.queue import QueueUnavailable
from data.replays import Replay
from data.trajectories import Trajectory

router = APIRouter(tags=["replays"])


@router.post("/notebooks/{notebook_id}/replays", response_model=ReplayOut,
             status_code=status.HTTP_201_CREATED, responses=errors(404, 429, 503))
def create_replay(notebook_id: int, body: ReplayCreate, session: SessionDep,
                  principal: PrincipalDep) -> ReplayOut:
    """Replay the notebook's field edit (its document, field and question) on the vLLM server as
    in-place rewrites, errata and hoisted fields; the worker's `kvnotes.replay` sends the requests."""
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    try:
        free = at_the_keyboard(session, principal.via)  # the operator at the keyboard names any server
        replay = start_replay(session, notebook, body, principal.name, free)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return ReplayOut.of(replay)


@router.get("/notebooks/{notebook_id}/replays", response_model=list[ReplayOut], responses=errors(404))
def list_replays(notebook_id: int, session: SessionDep,
                 limit: int = Query(default=20, ge=1, le=200, description="at most this many, newest first"),
                 ) -> list[ReplayOut]:
    get_or_404(session, Notebook, notebook_id, "notebook")
    return [ReplayOut.of(r) for r in replays_of(session, notebook_id, limit)]


@router.post("/trajectories/{trajectory_id}/replays", response_model=ReplayOut,
             status_code=status.HTTP_201_CREATED, responses=errors(404, 429, 503))
def create_trajectory_replay(trajectory_id: int, body: TrajectoryReplayCreate, session: SessionDep,
                             principal: PrincipalDep) -> ReplayOut:
    """Replay the trajectory's turns on the vLLM server, one chat request per turn in order, with the
    field changes rewritten in place, as errata, or hoisted; its `result` reports per variant and turn
    the hit rate and TTFT, and over the turns the hit rate and cumulative TTFT."""
    row = get_or_404(session, Trajectory, trajectory_id, "trajectory")
    try:
        free = at_the_keyboard(session, principal.via)
        replay = start_trajectory_replay(session, row, body, principal.name, free)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return ReplayOut.of(replay)


@router.get("/trajectories/{trajectory_id}/replays", response_model=list[ReplayOut], responses=errors(404))
def list_trajectory_replays(trajectory_id: int, session: SessionDep,
                            limit: int = Query(default=20, ge=1, le=200,
                                               description="at most this many, newest first"),
                            ) -> list[ReplayOut]:
    get_or_404(session, Trajectory, trajectory_id, "trajectory")
    return [ReplayOut.of(r) for r in replays_of_trajectory(session, trajectory_id, limit)]


@router.get("/replays/{replay_id}", response_model=ReplayOut, responses=errors(404))
def read_replay(replay_id: int, session: SessionDep) -> ReplayOut:
    return ReplayOut.of(get_or_404(session, Replay, replay_id, "replay"))


@router.post("/replays/{replay_id}/cancel", response_model=ReplayOut, responses=errors(404, 409))
def cancel(replay_id: int, session: SessionDep) -> ReplayOut:
    """Stop a queued or running replay: the worker sends no more requests and keeps no result."""
    replay = get_or_404(session, Replay, replay_id, "replay")
    if not cancel_replay(session, replay):
        raise HTTPException(status_code=409, detail=f"replay {replay_id} already {replay.status}")
    return ReplayOut.of(replay)
