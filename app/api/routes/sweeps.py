"""Sweeps: start one over many edits of a notebook's fields (422 naming the row and column of bad
input, 429 past the sweep cap, 503 when the broker cannot take it: nothing saved), read it (the
one `SweepView`: per-strategy agreement with 95% confidence sequences, each candidate's standing
and `needed`, the frontier, the policy at a threshold given here or the sweep's own) and cancel it
(finished edits are kept). A finished sweep's policy can be adopted by its notebook (later runs'
`auto` runs only the strategy it names; per field, the strategy of the field a run edits) and
dropped again."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import NotebookOut
from app.services.notebook_view import notebook_view
from app.services.sweep_input import SweepCreate
from app.services.sweep_view import SweepView, build_sweep_view
from app.services.sweeps import adopt_policy, cancel_sweep, drop_policy, start_sweep
from data.models import Notebook, Sweep
from data.queue import QueueUnavailable

router = APIRouter(tags=["sweeps"])
Threshold = Query(default=None, gt=0.0, lt=1.0,
                  description="the policy's threshold on both lower bounds, agreement on every "
                              "determined edit and on the changed edits (default: the sweep's own); "
                              "nothing is run again")
PerField = Query(default=False,
                 description="also adopt each field's own policy (a sweep that edited its fields "
                             "separately): a run's auto then runs the strategy of the field(s) it edits")


@router.post("/notebooks/{notebook_id}/sweeps", response_model=SweepView,
             status_code=status.HTTP_201_CREATED, responses=errors(404, 429, 503))
def create_sweep(notebook_id: int, body: SweepCreate, session: SessionDep,
                 principal: PrincipalDep) -> SweepView:
    """One run per edit on the model's queue, behind other users' runs."""
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    try:
        sweep = start_sweep(session, notebook, body, principal.name)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return build_sweep_view(session, sweep)


@router.get("/notebooks/{notebook_id}/sweeps", response_model=list[int], responses=errors(404))
def list_sweeps(notebook_id: int, session: SessionDep) -> list[int]:
    """The notebook's sweeps' ids, newest first."""
    get_or_404(session, Notebook, notebook_id, "notebook")
    return list(session.scalars(select(Sweep.id).where(Sweep.notebook_id == notebook_id)
                                .order_by(Sweep.id.desc())))


@router.get("/sweeps/{sweep_id}", response_model=SweepView, responses=errors(404))
def read_sweep(sweep_id: int, session: SessionDep, threshold: float | None = Threshold) -> SweepView:
    return build_sweep_view(session, get_or_404(session, Sweep, sweep_id, "sweep"), threshold)


@router.post("/sweeps/{sweep_id}/cancel", response_model=SweepView, responses=errors(404, 409))
def cancel(sweep_id: int, session: SessionDep) -> SweepView:
    """Cancel the edits not yet finished; the finished ones are kept and counted."""
    sweep = get_or_404(session, Sweep, sweep_id, "sweep")
    if sweep.status not in ("queued", "running"):
        raise HTTPException(status_code=409, detail=f"sweep {sweep_id} already {sweep.status}")
    cancel_sweep(session, sweep)
    return build_sweep_view(session, sweep)


@router.post("/sweeps/{sweep_id}/adopt", response_model=NotebookOut, responses=errors(404))
def adopt(sweep_id: int, session: SessionDep, threshold: float | None = Threshold,
          per_field: bool = PerField) -> NotebookOut:
    """The notebook adopts the finished sweep's policy at `threshold`: its later runs' `auto` runs
    only the strategy the policy names, at that strategy's cost (422 while the sweep runs). With
    `per_field=true` (a sweep that edited its fields separately), each field's own policy too: a
    run's `auto` runs the strategy of the field it edits, the most conservative of them when it
    edits several (`policy_note` in its snapshot says which)."""
    notebook = adopt_policy(session, get_or_404(session, Sweep, sweep_id, "sweep"), threshold, per_field)
    return notebook_view(notebook)


@router.delete("/notebooks/{notebook_id}/policy", response_model=NotebookOut, responses=errors(404))
def drop(notebook_id: int, session: SessionDep) -> NotebookOut:
    """Drop the adopted policy: `auto` is the oracle pick that costs every probe again."""
    return notebook_view(drop_policy(session, get_or_404(session, Notebook, notebook_id, "notebook")))
