"""Runs: start one (snapshot + enqueue, or 503 and nothing saved), watch it, cancel it, and read
its results and the decision's attention maps."""

from __future__ import annotations

from typing import Literal

import numpy as np
from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy import select
from sqlalchemy.orm import undefer

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import AttentionOut, RunCreate, RunOut, RunSummary, StrategyResultOut
from app.services.notebooks import Unprocessable
from app.services.runs import cancel_run as cancel_run_service
from app.services.runs import question_for, start_run
from data.models import Notebook, Run, RunResult
from data.queue import QueueUnavailable
from data.watchdog import reap_for_reader

router = APIRouter(tags=["runs"])


def run_out(run: Run) -> RunOut:
    return RunOut(
        id=run.id,
        notebook_id=run.notebook_id,
        kind=run.kind,
        status=run.status,  # type: ignore[arg-type]
        stage=run.stage,
        progress=run.progress,
        error=run.error,
        worker=run.worker,
        task_id=run.task_id,
        strategies=run.strategies,
        created_by=run.created_by,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        heartbeat_at=run.heartbeat_at,
        timings=run.timings or {},
        snapshot=run.snapshot,
        results={r.strategy: StrategyResultOut.model_validate(r) for r in run.results},
        attribution=run.attribution,
    )


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
        run = start_run(session, notebook, question, body.strategies, body.attribution, principal.name)
    except QueueUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return run_out(run)


@router.get("/notebooks/{notebook_id}/runs", response_model=list[RunSummary], responses=errors(404))
def list_runs(notebook_id: int, session: SessionDep) -> list[Run]:
    get_or_404(session, Notebook, notebook_id, "notebook")
    return list(session.scalars(select(Run).where(Run.notebook_id == notebook_id).order_by(Run.id.desc())))


@router.get("/runs/{run_id}", response_model=RunOut, responses=errors(404))
def read_run(run_id: int, session: SessionDep) -> RunOut:
    reap_for_reader(session)
    return run_out(get_or_404(session, Run, run_id, "run"))


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
    strategy: str = "recompute",
    layer: int | None = Query(default=None, ge=0),
    head: int | None = Query(default=None, ge=0),
    agg: Literal["mean", "max"] | None = None,
    query: int | None = Query(default=None, ge=0, description="index of a question or answer token; default: the decision"),
) -> AttentionOut:
    """Where a token looked over the others. The decision (the default query) has a map per layer
    and head: `layer` and `head` pick one, a missing one is aggregated over (`agg`, default mean).
    Any other question or answer token's map is averaged over layers and heads."""
    get_or_404(session, Run, run_id, "run")
    result = session.scalar(
        select(RunResult)
        .where(RunResult.run_id == run_id, RunResult.strategy == strategy)
        .options(undefer(RunResult.attention), undefer(RunResult.query_attention))
    )
    if result is None or result.attention is None or not result.attention_shape:
        raise HTTPException(status_code=404, detail=f"run {run_id} has no attention for strategy {strategy}")
    shape = [int(n) for n in result.attention_shape]
    decision = result.decision_index if result.decision_index is not None else shape[2] - 1
    if query is not None and query != decision:
        values = _query_values(result, query, shape[2], layer, head)
        return AttentionOut(run_id=run_id, strategy=strategy, layer=None, head=None, agg="mean", shape=shape,
                            query=query, decision=decision, query_start=result.query_start,
                            tokens=result.tokens or [], values=values)
    weights = np.frombuffer(result.attention, dtype=np.float16).reshape(shape)  # [layers, heads, T]
    for name, value, size in (("layer", layer, shape[0]), ("head", head, shape[1])):
        if value is not None and value >= size:
            raise Unprocessable(name, f"{name}={value} is out of range: this model has {size} (0..{size - 1})")
    picked = weights.astype(np.float32)
    picked = picked[layer : layer + 1] if layer is not None else picked
    picked = picked[:, head : head + 1] if head is not None else picked
    reduce = np.max if agg == "max" else np.mean
    values = reduce(picked.reshape(-1, shape[2]), axis=0)  # [T]
    return AttentionOut(
        run_id=run_id,
        strategy=strategy,
        layer=layer,
        head=head,
        agg=None if (layer is not None and head is not None) else (agg or "mean"),
        shape=shape,
        query=decision,
        decision=decision,
        query_start=result.query_start,
        tokens=result.tokens or [],
        values=[round(float(v), 6) for v in values],
    )


def _query_values(result: RunResult, query: int, n_tokens: int, layer: int | None, head: int | None) -> list[float]:
    """Row `query` of the per-query maps (mean over layers and heads), or a 422 naming the problem."""
    start = result.query_start
    if result.query_attention is None or start is None:
        raise Unprocessable("query", "this run kept only the decision's attention (it ran before per-token queries)")
    if not start <= query < n_tokens:
        raise Unprocessable("query", f"query={query} is not a question or answer token: choose {start}..{n_tokens - 1}")
    if layer is not None or head is not None:
        raise Unprocessable("query", "per-layer and per-head maps are kept for the decision only; "
                                     "other queries are averaged over layers and heads")
    rows = np.frombuffer(result.query_attention, dtype=np.float16).reshape(-1, n_tokens)  # [Q, T]
    return [round(float(v), 6) for v in rows[query - start].astype(np.float32)]
