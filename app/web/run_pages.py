"""The run permalink (exactly what was run, the decision diff, answers side by side, the
attention heatmaps), the progress fragment that polls while a run is live and stops when it
ends, cancelling, and the head-by-head attention difference the heatmap grid is coloured by.
"""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import undefer

from app.api.deps import SessionDep, get_or_404
from app.services.runs import cancel_run
from app.web.run_view import (
    agreement_summary,
    align_tokens,
    answer_of,
    decision_rows,
    default_strategy,
    head_differences,
    measured_ttft,
    notes_map_pieces,
    run_note,
    snapshot_pieces,
    top_spans,
    word_diff,
)
from app.web.templating import render
from data.models import Notebook, Run, RunResult
from data.watchdog import reap_for_reader
from worker.engine.vocabulary import METRICS

router = APIRouter()


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: int, session: SessionDep) -> Response:
    run = get_or_404(session, Run, run_id, "run")
    rows = decision_rows(run)
    agree, compared = agreement_summary(rows)
    by_name = {r.strategy: r for r in run.results}
    reference = by_name.get("recompute")
    answers = []
    for row in rows:
        if row.result is None:
            continue
        text = answer_of(row.result)
        diff = word_diff(answer_of(reference), text) if reference is not None and not row.is_reference else [("equal", text)]
        answers.append({"row": row, "diff": diff, "same": all(op == "equal" for op, _ in diff)})
    with_attention = [r.strategy for r in run.results if r.attention_shape]
    notebook = session.get(Notebook, run.notebook_id) if run.notebook_id else None
    notes_map = run.attribution
    return render(
        request, "run.html", run=run, rows=rows, agree=agree, compared=compared, answers=answers,
        snapshot=run.snapshot, pieces=snapshot_pieces(run.snapshot), notebook=notebook,
        attention_strategies=with_attention, attention_shape=_shape(run), nav="runs",
        default_strategy=default_strategy(rows, with_attention), note=run_note(rows, run.snapshot),
        ttft_measured=measured_ttft(run), metric_help={m.name: m.help for m in METRICS},
        notes_map=notes_map, map_pieces=notes_map_pieces(run.snapshot, notes_map) if notes_map else [],
        top_spans=top_spans(notes_map) if notes_map else [],
    )


def _shape(run: Run) -> list[int] | None:
    for r in run.results:
        if r.attention_shape:
            return [int(n) for n in r.attention_shape]
    return None


@router.get("/runs/{run_id}/progress")
def run_progress(request: Request, run_id: int, session: SessionDep, compact: str = "") -> Response:
    """The live fragment. While the run is live it carries `hx-trigger="every 1s"`; once finished
    it does not, and a finished run on its own page is answered with 286 (htmx: stop polling)
    plus HX-Refresh so the page shows the results."""
    reap_for_reader(session)
    run = get_or_404(session, Run, run_id, "run")
    extra = {}
    if run.is_finished and compact and run.notebook_id:  # the notebook's runs table, refreshed once
        query = select(Run).where(Run.notebook_id == run.notebook_id).order_by(Run.id.desc()).limit(10)
        extra["notebook_runs"] = list(session.scalars(query))
    response = render(request, "_run_progress.html", run=run, compact=bool(compact), **extra)
    if run.is_finished and not compact and request.headers.get("HX-Request") == "true":
        response.status_code = 286
        response.headers["HX-Refresh"] = "true"
    return response


@router.post("/runs/{run_id}/cancel")
def run_cancel(request: Request, run_id: int, session: SessionDep, compact: str = "") -> Response:
    """Same rule as POST /api/runs/{id}/cancel: mark it cancelled (the worker checks between
    stages) and revoke its task; a finished run is left as it is."""
    run = get_or_404(session, Run, run_id, "run")
    cancel_run(session, run)
    return render(request, "_run_progress.html", run=run, compact=bool(compact))


@router.get("/runs/{run_id}/attention/heads")
def attention_heads(run_id: int, session: SessionDep, strategy: str) -> JSONResponse:
    """For the heatmap: which recompute token each of `strategy`'s tokens corresponds to, and how
    far each head's attention is from recompute's (total variation over aligned tokens) — the
    colours of the layer × head grid."""
    get_or_404(session, Run, run_id, "run")
    results = {
        r.strategy: r
        for r in session.scalars(
            select(RunResult)
            .where(RunResult.run_id == run_id, RunResult.strategy.in_([strategy, "recompute"]))
            .options(undefer(RunResult.attention))
        )
    }
    ref, res = results.get("recompute"), results.get(strategy)
    if ref is None or res is None or ref.attention is None or res.attention is None:
        raise HTTPException(status_code=404, detail=f"run {run_id} has no attention for {strategy} and recompute")
    mapping = align_tokens(res.tokens or [], ref.tokens or [])
    w = np.frombuffer(res.attention, dtype=np.float16).reshape(res.attention_shape).astype(np.float32)
    r = np.frombuffer(ref.attention, dtype=np.float16).reshape(ref.attention_shape).astype(np.float32)
    if w.shape[:2] != r.shape[:2] or len(mapping) != w.shape[2]:
        raise HTTPException(status_code=409, detail="attention shapes of the two strategies do not line up")
    heads = head_differences(w, r, mapping)
    return JSONResponse({
        "strategy": strategy,
        "shape": list(w.shape),
        "map": mapping,
        "head_diff": [[round(float(v), 5) for v in row] for row in heads],
        "mean_diff": [round(float(v), 5) for v in heads.mean(axis=1)],
    })
