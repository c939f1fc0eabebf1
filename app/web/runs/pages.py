"""The runs list (newest first, a page at a time); the run permalink (exactly what was run, the
decision diff, answers side by side, the attention heatmaps), the progress fragment that polls
while a run is live and stops when it ends, cancelling, the head-by-head attention difference
the heatmap grid is coloured by, and the most-attended notes of the view on screen.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import func, select

from app.api.deps import SessionDep, get_or_404
from app.services.attention import NoAttention, compare_heads, results_with_attention
from app.services.runs import cancel_run, waits_without_worker, worker_step
from app.web.notebooks.context import decision_summary
from app.web.paging import page_param, paginate
from app.web.runs.context import ViewDep, checked_view, run_context
from app.web.runs.heatmap_view import (
    GRID_ZERO,
    HeatmapPanels,
    TopToken,
    grid_colour,
    heatmap_panels,
    paint,
    ramps,
    top_tokens,
)
from app.web.runs.regions_view import regions_panel
from app.web.runs.render_cache import VIEW, cached
from app.web.runs.top_lines import lines_by_default, top_lines
from app.web.templating import render, templates
from data.models import Run, RunStatus, notebook_runs
from vocabulary import REFERENCE

router = APIRouter()
RUNS_PER_PAGE = 50


@router.get("/runs")
def runs_page(request: Request, session: SessionDep, page: int = page_param()) -> Response:
    """The user's own runs, newest first; a sweep's edits are listed on their sweep's page (issue 43:
    cancelled sweep edits stood above the user's run), only counted here: the edits that ran, i.e.
    finished (issue 51: 2 of 40 edits run were counted 40; queued and cancelled ones never ran)."""
    own = select(Run).where(Run.sweep_id.is_(None)).order_by(Run.id.desc())
    pager, runs = paginate(session, own, page, RUNS_PER_PAGE, "/runs")
    sweep_edits = session.scalar(select(func.count(Run.id)).where(
        Run.sweep_id.is_not(None), Run.status.in_((RunStatus.SUCCEEDED, RunStatus.FAILED)))) or 0
    return render(request, "runs.html", recent_runs=runs, page=pager, sweep_edits=sweep_edits, nav="runs")


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: int, session: SessionDep, asked: ViewDep) -> Response:
    """The run, opened on the attention view its URL names (a permalink: `strategy`, `layer`,
    `head`, `agg`, `query`); the page keeps the URL in step as the view changes."""
    run = get_or_404(session, Run, run_id, "run")
    context = run_context(session, run)  # the regions panel comes after the page: /runs/{id}/regions
    return render(request, "run.html", **context, view=checked_view(run, context, asked), ramps=ramps(),
                  nav="runs")


@router.get("/runs/{run_id}/regions")
def run_regions(request: Request, run_id: int, session: SessionDep) -> Response:
    """The run page's attention by region panel, which reads every strategy's attention (seconds on
    a long run): the page loads it after it opens, and a finished run's is built once
    (`render_cache`). Empty when the run has no attention."""
    run = get_or_404(session, Run, run_id, "run")

    def build() -> Response:
        panel = regions_panel(session, run) if run.results else None
        page = templates.get_template("_attention_regions.html").render(regions=panel) if panel else ""
        return Response(page, media_type="text/html; charset=utf-8")

    return cached(request, session, run, "regions", build)


@router.get("/runs/{run_id}/progress")
def run_progress(request: Request, run_id: int, session: SessionDep, compact: str = "") -> Response:
    """The live fragment. While the run is live it carries `hx-trigger="every 1s"`; once finished
    it does not, and a finished run on its own page is answered with 286 (htmx: stop polling)
    plus HX-Refresh so the page shows the results. On the run page each answer also swaps the
    header's status badge (one state); on the notebook a succeeded run brings its decision summary."""
    run = get_or_404(session, Run, run_id, "run")
    extra: dict = {"polled": True}
    if run.is_finished and compact and run.notebook_id:  # the notebook's runs table, refreshed once
        extra["notebook_runs"] = list(session.scalars(notebook_runs(run.notebook_id).limit(10)))
        extra["summary"] = decision_summary(session, run)  # the decision summary, without a click
    extra["no_live_worker"] = waits_without_worker(session, run)  # asked here: templates never query
    extra["worker_step"] = worker_step(session, run)
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


def _panels(session: SessionDep, run_id: int, asked) -> HeatmapPanels:
    """The three panels of the view `asked` names (as a permalink names it): 422 naming what it
    cannot show, 404 when the run stored no attention."""
    run = get_or_404(session, Run, run_id, "run")
    with_attention = [r.strategy for r in run.results if r.attention_shape]
    view = checked_view(run, {"attention_strategies": with_attention, "default_strategy": None}, asked)
    if view is None:
        raise HTTPException(status_code=404, detail=f"run {run_id} stored no attention maps")
    return heatmap_panels(session, run_id, view)


@router.get("/runs/{run_id}/attention/paint", response_class=JSONResponse)
def attention_paint(request: Request, run_id: int, session: SessionDep, asked: ViewDep, rows: str = "",
                    all: str = "") -> Response:
    """The colours of one view's three panels (`?strategy=&layer=&head=&agg=&query=`), computed
    by the one colour model the report, the presentation, compare and the SVG share. `rows=1` adds
    the view's most-attended rows as `/attention/top` renders them (`all=1`: the sink, whitespace
    and punctuation too), so the run page computes a view once; built once for a finished run
    (`render_cache`)."""
    run = get_or_404(session, Run, run_id, "run")

    def build() -> JSONResponse:
        p = _panels(session, run_id, asked)
        colours = paint(p)
        if rows:
            colours["rows"] = templates.get_template("_top_rows.html").render(top=_top(p, bool(all)))
            # the same view's lines and sentences, and whether they lead (top tokens all function words)
            lines = top_lines(p.res_tokens, p.ref_values, p.res_values, p.mapping)
            colours["lines"] = templates.get_template("_top_lines.html").render(lines=lines)
            colours["lines_default"] = lines_by_default([t.text for t in p.top])
        return JSONResponse(colours)

    return cached(request, session, run, "attention/paint", build, (*VIEW, "rows", "all"))


@router.get("/runs/{run_id}/attention/top")
def attention_top(request: Request, run_id: int, session: SessionDep, asked: ViewDep,
                  all: str = "") -> Response:
    """The most-attended notes of one view, as the rows of the run page's table: ranked on the
    server, as the report, the presentation and the exports rank them. `all=1` keeps the sink,
    whitespace and punctuation."""
    return render(request, "_top_rows.html", top=_top(_panels(session, run_id, asked), bool(all)))


def _top(p: HeatmapPanels, every: bool) -> list[TopToken]:
    return top_tokens(p.res_tokens, p.ref_values, p.res_values, p.mapping, words=False) if every else p.top


@router.get("/runs/{run_id}/attention/heads", response_class=JSONResponse)
def attention_heads(request: Request, run_id: int, session: SessionDep, strategy: str) -> Response:
    """For the heatmap: which recompute token each of `strategy`'s tokens corresponds to, and how
    far each head's attention is from recompute's (total variation over aligned tokens) — the
    colours of the layer × head grid."""
    run = get_or_404(session, Run, run_id, "run")
    return cached(request, session, run, "attention/heads", lambda: _heads(session, run_id, strategy),
                  ("strategy",))


def _heads(session: SessionDep, run_id: int, strategy: str) -> JSONResponse:
    results = results_with_attention(session, run_id, [strategy, REFERENCE])
    try:
        compared = compare_heads(results.get(strategy), results.get(REFERENCE), strategy)
    except NoAttention:
        raise HTTPException(
            status_code=404, detail=f"run {run_id} has no attention for {strategy} and recompute"
        ) from None
    heads = compared.head_diff
    return JSONResponse({
        "strategy": strategy,
        "shape": [*heads.shape, len(compared.mapping)],
        "map": compared.mapping,
        "head_diff": [[round(float(v), 5) for v in row] for row in heads],
        "mean_diff": [round(float(v), 5) for v in heads.mean(axis=1)],
        "colours": [[grid_colour(float(v)) for v in row] for row in heads],
        "zero": GRID_ZERO,  # below this a head draws as no change
    })
