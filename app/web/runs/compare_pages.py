"""`/compare?runs=A,B[,C…]`: runs side by side — each run's verdict, every strategy's decision and
metrics in one table, and one strategy's attention over the text its notes hold in each run, aligned
line by line (`app.web.runs.compare_view`). Reached from a notebook's history (tick runs) and
from a run page ("Compare with the previous run")."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response

from app.api.deps import SessionDep, get_or_404
from app.web.runs.compare_view import (
    aligned_rows,
    common_attention,
    common_share,
    run_attention,
    run_columns,
    strategy_order,
)
from app.web.runs.heatmap_view import hex_colour, seq_stops
from app.web.templating import render
from data.models import Run

router = APIRouter()
MAX_RUNS = 6


def _run_ids(values: list[str]) -> list[int]:
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip().lstrip("#")
            if not part:
                continue
            if not part.isdigit():
                raise HTTPException(status_code=422,
                                    detail=f"runs: {part[:20]!r} is not a run number; write runs=12,15")
            if int(part) not in ids:
                ids.append(int(part))
    if len(ids) < 2:
        raise HTTPException(status_code=422,
                            detail="runs: name two or more runs to compare, e.g. /compare?runs=12,15 "
                                   "(or tick them in a notebook's history)")
    if len(ids) > MAX_RUNS:
        raise HTTPException(status_code=422,
                            detail=f"runs: at most {MAX_RUNS} runs side by side; got {len(ids)}")
    return sorted(ids)  # in the order they ran: before, then after


@router.get("/compare")
def compare(request: Request, session: SessionDep, runs: list[str] = Query(default=[]),
            strategy: str | None = None) -> Response:
    """`runs` as `A,B` (or repeated, as the history's checkboxes send it), shown in the order they
    ran; `strategy`: whose attention to draw (any strategy every run kept attention for; recompute by
    default)."""
    picked = [get_or_404(session, Run, ident, "run") for ident in _run_ids(runs)]
    columns = run_columns(session, picked)
    shared = common_attention(picked)
    if strategy is not None and strategy not in shared:
        choices = ", ".join(shared) or "none: these runs share no attention maps"
        raise HTTPException(status_code=422,
                            detail=f"strategy: {strategy[:40]!r} has no attention in every run; "
                                   f"choose one of {choices}")
    chosen = strategy or (shared[0] if shared else None)
    attention = [run_attention(session, run, chosen) for run in picked] if chosen else None
    rows, vmax = aligned_rows(picked, attention)
    same_document = len({r.snapshot.document for r in picked}) == 1
    return render(
        request, "compare.html", columns=columns, strategies=strategy_order(columns), shared=shared,
        chosen=chosen, rows=rows, vmax=vmax, same_document=same_document, common=common_share(rows),
        run_ids=",".join(str(r.id) for r in picked),
        seq_ramp=[hex_colour(c) for c in seq_stops()], nav="runs",
    )
