"""The notebook's Serving panel: start a replay of its field edit on a vLLM server (the same checks
and messages as `POST /api/notebooks/{id}/replays`), watch it, and its permalink and exports.

    GET  /notebooks/{id}/serving     the panel (the notebook page loads it into place)
    POST /notebooks/{id}/replays     the panel's form: 422 with the message beside its field
    GET  /replays/{id}/panel         the replay's box, polled while it runs
    POST /replays/{id}/cancel        the box's Cancel button (a finished replay is left as it is)
    GET  /replays/{id}               the permalink page
    GET  /replays/{id}/export.json   the replay as the API returns it
    GET  /replays/{id}/export.csv    one line per request (a trajectory's: per variant and turn)

A trajectory's "Replay on vLLM" panel (the trajectory page loads it into place; the same checks and
messages as `POST /api/trajectories/{id}/replays`); its replay's box, cancel, permalink and exports
are the routes above, which show a trajectory replay turn by turn (`app.web.serving.turns`):

    GET  /trajectories/{id}/serving  the panel
    POST /trajectories/{id}/replays  the panel's form: 422 with the message beside its field
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.schemas import ReplayCreate, ReplayOut, TrajectoryReplayCreate
from app.services.errors import RunLimitReached, Unprocessable
from app.services.replays import (
    at_the_keyboard,
    cancel_replay,
    replays_of,
    replays_of_trajectory,
    start_replay,
    start_trajectory_replay,
)
from app.web.forms import lines, parse_int, parse_number, validate
from app.web.serving.turns import trajectory_replay_context, trajectory_replay_csv
from app.web.serving.view import panel_context, replay_csv, run_estimates
from app.web.templating import render
from data.models import Notebook
from data.queue import QueueUnavailable
from data.replays import Replay
from data.settings import get_settings
from data.trajectories import Trajectory
from vocabulary.replay import TRAJECTORY_VARIANT_HELP, VARIANT_HELP, VARIANTS

router = APIRouter(include_in_schema=False)
Text = Annotated[str, Form()]


def _panel(request: Request, session: Session, notebook: Notebook, replay: Replay | None, status: int = 200,
           errors: dict | None = None, values: dict | None = None) -> Response:
    settings = get_settings()
    defaults = {"url": settings.vllm_url, "model": settings.vllm_model, "values": "", "requests": "",
                "rate": "1", "concurrency": "4", "variants": list(VARIANTS), "extend_choices": False}
    return render(request, "_serving.html", status, notebook=notebook, errors=errors or {},
                  values={**defaults, **(values or {})}, VARIANTS=VARIANTS, VARIANT_HELP=VARIANT_HELP,
                  gateway_template=settings.gateway_notebook == notebook.id,
                  **panel_context(replay, run_estimates(session, notebook.id)))


@router.get("/notebooks/{notebook_id}/serving")
def serving_panel(request: Request, notebook_id: int, session: SessionDep) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    latest = replays_of(session, notebook_id, 1, edits_only=True)
    return _panel(request, session, notebook, latest[0] if latest else None)


@router.post("/notebooks/{notebook_id}/replays")
def create_replay(request: Request, notebook_id: int, session: SessionDep, principal: PrincipalDep,
                  url: Text = "", model: Text = "", values: Text = "", requests: Text = "", rate: Text = "1",
                  concurrency: Text = "4", variants: Annotated[list[str] | None, Form()] = None,
                  extend_choices: Annotated[str | None, Form()] = None) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    form = {"url": url, "model": model, "values": values, "requests": requests, "rate": rate,
            "concurrency": concurrency, "variants": variants or [], "extend_choices": bool(extend_choices)}
    try:
        # the form's numbers are text; the API's are strict JSON numbers
        body = validate(ReplayCreate, {"url": url, "model": model, "values": lines(values),
                                       "requests": parse_int(requests, "requests") or 0,
                                       "rate": parse_number(rate, "rate", 1.0),
                                       "concurrency": parse_int(concurrency, "concurrency") or 4,
                                       "variants": variants or [], "extend_choices": bool(extend_choices)})
        free = at_the_keyboard(session, principal.via)  # the operator at the keyboard names any server
        replay = start_replay(session, notebook, body, principal.name, free)
    except Unprocessable as exc:
        session.rollback()
        return _panel(request, session, notebook, None, 422, exc.errors, form)
    except QueueUnavailable as exc:
        return _panel(request, session, notebook, None, 503,
                      {"form": f"The replay could not be queued, nothing was saved: {exc.reason}"}, form)
    return _panel(request, session, notebook, replay, 201, values=form)


def _context(session: Session, replay: Replay) -> dict:
    """The box's values: a trajectory replay's turns, or a field edit's variants."""
    if replay.trajectory_id is not None:
        return trajectory_replay_context(replay)
    return panel_context(replay, run_estimates(session, replay.notebook_id))


def _box(request: Request, session: Session, replay: Replay, status: int = 200) -> Response:
    template = "_trajectory_replay.html" if replay.trajectory_id is not None else "_replay.html"
    return render(request, template, status, **_context(session, replay))


@router.get("/replays/{replay_id}/panel")
def replay_box(request: Request, replay_id: int, session: SessionDep) -> Response:
    return _box(request, session, get_or_404(session, Replay, replay_id, "replay"))


@router.post("/replays/{replay_id}/cancel")
def replay_cancel(request: Request, replay_id: int, session: SessionDep) -> Response:
    replay = get_or_404(session, Replay, replay_id, "replay")
    cancel_replay(session, replay)
    return _box(request, session, replay)


@router.get("/replays/{replay_id}")
def replay_page(request: Request, replay_id: int, session: SessionDep) -> Response:
    replay = get_or_404(session, Replay, replay_id, "replay")
    notebook = session.get(Notebook, replay.notebook_id) if replay.notebook_id else None
    return render(request, "replay.html", notebook=notebook, nav="notebooks", **_context(session, replay))


@router.get("/replays/{replay_id}/export.json")
def replay_json(replay_id: int, session: SessionDep) -> JSONResponse:
    replay = get_or_404(session, Replay, replay_id, "replay")
    return JSONResponse(ReplayOut.of(replay).model_dump(mode="json"),
                        headers={"Content-Disposition": f'attachment; filename="replay-{replay_id}.json"'})


@router.get("/replays/{replay_id}/export.csv")
def replay_csv_export(replay_id: int, session: SessionDep) -> Response:
    replay = get_or_404(session, Replay, replay_id, "replay")
    text = trajectory_replay_csv(replay) if replay.trajectory_id is not None else replay_csv(replay)
    return Response(text, media_type="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="replay-{replay_id}.csv"'})


# ---- a trajectory's "Replay on vLLM" panel -------------------------------------------------------


def _trajectory_panel(request: Request, session: Session, row: Trajectory, replay: Replay | None,
                      status: int = 200, errors: dict | None = None, values: dict | None = None) -> Response:
    settings = get_settings()
    defaults = {"url": settings.vllm_url, "model": settings.vllm_model, "variants": list(VARIANTS)}
    earlier = [r for r in replays_of_trajectory(session, row.id, 10) if replay is None or r.id != replay.id]
    return render(request, "_trajectory_serving.html", status, trajectory=row, errors=errors or {},
                  values={**defaults, **(values or {})}, VARIANTS=VARIANTS,
                  TRAJECTORY_VARIANT_HELP=TRAJECTORY_VARIANT_HELP, earlier=earlier,
                  **trajectory_replay_context(replay))


@router.get("/trajectories/{trajectory_id}/serving")
def trajectory_serving_panel(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    row = get_or_404(session, Trajectory, trajectory_id, "trajectory")
    latest = replays_of_trajectory(session, trajectory_id, 1)
    return _trajectory_panel(request, session, row, latest[0] if latest else None)


@router.post("/trajectories/{trajectory_id}/replays")
def create_trajectory_replay(request: Request, trajectory_id: int, session: SessionDep,
                             principal: PrincipalDep, url: Text = "", model: Text = "",
                             variants: Annotated[list[str] | None, Form()] = None) -> Response:
    row = get_or_404(session, Trajectory, trajectory_id, "trajectory")
    form = {"url": url, "model": model, "variants": variants or []}
    try:
        body = validate(TrajectoryReplayCreate, {"url": url, "model": model, "variants": variants or []})
        free = at_the_keyboard(session, principal.via)  # the operator at the keyboard names any server
        replay = start_trajectory_replay(session, row, body, principal.name, free)
    except Unprocessable as exc:
        session.rollback()
        return _trajectory_panel(request, session, row, None, 422, exc.errors, form)
    except RunLimitReached as exc:
        return _trajectory_panel(request, session, row, None, 429, {"form": str(exc)}, form)
    except QueueUnavailable as exc:
        return _trajectory_panel(request, session, row, None, 503,
                                 {"form": f"The replay could not be queued, nothing was saved: {exc.reason}"},
                                 form)
    return _trajectory_panel(request, session, row, replay, 201, values=form)
