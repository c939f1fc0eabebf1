"""Runs: start one (snapshot + enqueue, or 503 and nothing saved), run a snapshot again, watch it,
cancel it, and read its results and the decision's attention maps."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException, Query, status

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import AttentionOut, RunCreate, RunOut, RunSummary
from app.services.attention import NoAttention, attention_vector, results_with_attention
from app.services.run_view import run_out, run_view
from app.services.runs import cancel_run as cancel_run_service
from app.services.runs import question_for, rerun_snapshot, start_run
from data.models import Notebook, Run, notebook_runs
from data.queue import QueueUnavailable
from vocabulary import REFERENCE

router = APIRouter(tags=["runs"])



@router.post(
    "/notebooks/{notebook_id}/runs",
    response_model=RunOut,
    status_code=status.HTTP_201_CREATED,
    responses=errors(404, 429, 503),
)
def create_run(notebook_id: int, body: RunCreate, session: SessionDep, principal: PrincipalDep) -> RunOut:
    """Snapshot the notebook and enqueue `kvnotes.run`. If the broker cannot take it: 503 with the
    reason, and neither the run nor the question is saved."""
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    question = question_for(notebook, body)
    try:
        run = start_run(session, notebook, question, body.strategies, body.attribution, principal.name,
                        mechanism=body.mechanism)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return run_out(run)


@router.get("/notebooks/{notebook_id}/runs", response_model=list[RunSummary], responses=errors(404))
def list_runs(
    notebook_id: int, session: SessionDep,
    limit: int = Query(default=100, ge=1, le=1000, description="at most this many, newest first"),
    offset: int = Query(default=0, ge=0, le=2**62, description="skip this many"),
    sweeps: bool = Query(default=False, description="also the edits of the notebook's sweeps "
                                                    "(each with its sweep_id); by default its own runs"),
) -> list[Run]:
    get_or_404(session, Notebook, notebook_id, "notebook")
    return list(session.scalars(notebook_runs(notebook_id, sweeps).limit(limit).offset(offset)))


@router.post("/runs/{run_id}/rerun", response_model=RunOut, status_code=status.HTTP_201_CREATED,
             responses=errors(404, 429, 503))
def rerun(run_id: int, session: SessionDep, principal: PrincipalDep) -> RunOut:
    """A new run of exactly this run's snapshot (not the notebook as it is now); 503 and nothing
    saved when the broker cannot take it."""
    run = get_or_404(session, Run, run_id, "run")
    try:
        again = rerun_snapshot(session, run, principal.name)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return run_out(again)


@router.get("/runs/{run_id}", response_model=RunOut, responses=errors(404))
def read_run(run_id: int, session: SessionDep) -> RunOut:
    """The run, its results and the decision's attention by region (`attention_regions`)."""
    return run_view(session, get_or_404(session, Run, run_id, "run"))


@router.post("/runs/{run_id}/cancel", response_model=RunOut, responses=errors(404, 409))
def cancel_run(run_id: int, session: SessionDep) -> RunOut:
    """Mark the run cancelled (the worker checks between stages) and revoke its task."""
    run = get_or_404(session, Run, run_id, "run")
    if not cancel_run_service(session, run):
        raise HTTPException(status_code=409, detail=f"run {run_id} already {run.status}")
    return run_out(run)


@router.get("/runs/{run_id}/attention", response_model=AttentionOut, responses=errors(404))
def read_attention(
    run_id: int,
    session: SessionDep,
    strategy: str = REFERENCE,
    layer: int | None = Query(default=None, ge=0),
    head: int | None = Query(default=None, ge=0),
    agg: Literal["mean", "max"] | None = None,
    query: int | None = Query(
        default=None, ge=0, description="index of a question or answer token; default: the decision"
    ),
) -> AttentionOut:
    """Where a token looked over the others. The decision (the default query) has a map per layer
    and head: `layer` and `head` pick one, a missing one is aggregated over (`agg`, default mean).
    Any other question or answer token's map is averaged over layers and heads."""
    get_or_404(session, Run, run_id, "run")
    result = results_with_attention(session, run_id, [strategy]).get(strategy)
    try:
        view = attention_vector(result, strategy, layer, head, agg, query)
    except NoAttention:
        raise HTTPException(
            status_code=404, detail=f"run {run_id} has no attention for strategy {strategy}"
        ) from None
    return AttentionOut(
        run_id=run_id, strategy=strategy, layer=view.layer, head=view.head, agg=view.agg,  # type: ignore[arg-type]
        shape=view.shape, query=view.query, decision=view.decision, query_start=view.query_start,
        tokens=view.tokens, values=[round(float(v), 6) for v in view.values],
    )
