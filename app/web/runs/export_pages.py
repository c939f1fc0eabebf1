"""Exports of a run, each a URL the run page links to: the data (`export.json`), the decision
table (`export.csv`), pictures of the current heatmap and of the notes map (`heatmap.svg`,
`notes-map.svg`; the page turns them into PNG), and the standalone report (`report.html`).

The report is one self-contained file: the app's stylesheet, its script and its data inline, no
/static path, no URL, so it opens offline. Served by the app it carries its own
Content-Security-Policy, stricter than the app's: nothing may load at all, and the one inline
script runs because its hash is named.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from functools import lru_cache

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from app.api.deps import SessionDep, get_or_404
from app.services.attention import attention_vector, results_with_attention
from app.services.errors import Unprocessable
from app.services.run_view import run_view
from app.web.runs.context import ViewDep, checked_view, run_context
from app.web.runs.export import run_csv, run_json
from app.web.runs.heatmap_view import (
    ViewParams,
    div_stops,
    heatmap_panels,
    hex_colour,
    paint,
    seq_stops,
)
from app.web.runs.notes_map_view import lead_text
from app.web.runs.render_cache import VIEW, cached
from app.web.runs.svg_export import heatmap_svg, notes_map_svg
from app.web.strategy_css import strategy_css
from app.web.templating import ROOT, templates
from data.models import Run
from vocabulary import REFERENCE

router = APIRouter()
STYLESHEET = ROOT / "static" / "css" / "kvnotes.css"
REPORT_SCRIPT = ROOT / "static" / "js" / "report.js"


def _download(name: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}"'}


@router.get("/runs/{run_id}/export.json")
def export_json(request: Request, run_id: int, session: SessionDep, asked: ViewDep) -> Response:
    """Everything the run page shows, as data (the view the link names included); built once for
    a finished run (`render_cache`)."""
    run = get_or_404(session, Run, run_id, "run")
    return cached(request, session, run, "export.json", lambda: _export_json(session, run, asked), VIEW)


def _export_json(session: SessionDep, run: Run, asked) -> JSONResponse:
    context = run_context(session, run)
    return JSONResponse(run_json(session, run, context, checked_view(run, context, asked)))


@router.get("/runs/{run_id}/export.csv")
def export_csv(request: Request, run_id: int, session: SessionDep) -> Response:
    """The decision table: one row per strategy, recompute first."""
    run = get_or_404(session, Run, run_id, "run")
    def made() -> Response:
        context = run_context(session, run)
        return Response(run_csv(context.rows, context.decode_measured), media_type="text/csv; charset=utf-8",
                        headers=_download(f"run-{run_id}-decisions.csv"))

    return cached(request, session, run, "export.csv", made)


def _view_or_404(run: Run, context: dict, asked) -> ViewParams:
    view = checked_view(run, context, asked)
    if view is None:
        raise HTTPException(status_code=404, detail=f"run {run.id} stored no attention maps")
    return view


@router.get("/runs/{run_id}/heatmap.svg")
def export_heatmap_svg(request: Request, run_id: int, session: SessionDep, asked: ViewDep) -> Response:
    """The heatmap of the view the link names: recompute, the strategy, their difference."""
    run = get_or_404(session, Run, run_id, "run")
    return cached(request, session, run, "heatmap.svg", lambda: _heatmap_svg(session, run, asked), VIEW)


def _heatmap_svg(session: SessionDep, run: Run, asked) -> Response:
    context = run_context(session, run)
    view = _view_or_404(run, context, asked)
    heading = (f"Run #{run.id} · {run.snapshot.model} · {view.strategy} against recompute · "
               f"Q: {run.snapshot.question.text}")
    return Response(heatmap_svg(heatmap_panels(session, run.id, view), heading[:200]),
                    media_type="image/svg+xml")


@router.get("/runs/{run_id}/notes-map.svg")
def export_notes_map_svg(request: Request, run_id: int, session: SessionDep) -> Response:
    """The notes map drawn over the document."""
    run = get_or_404(session, Run, run_id, "run")
    return cached(request, session, run, "notes-map.svg", lambda: _notes_map_svg(session, run))


def _notes_map_svg(session: SessionDep, run: Run) -> Response:
    context = run_context(session, run)
    if not context["notes_map"]:
        raise HTTPException(status_code=404,
                            detail=f"run {run.id} has no notes map (run it with the notes map asked for)")
    summary = (f"{lead_text(run.snapshot, context['notes_map'])} Orange: later notes that close it, "
               "each patch alone (shares do not add up).")
    return Response(
        notes_map_svg(context["map_pieces"], f"Run #{run.id} · which notes carry the decision", summary),
        media_type="image/svg+xml",
    )


@lru_cache(maxsize=1)
def report_assets() -> tuple[str, str, str]:
    """(stylesheet, script, the script's CSP hash source) — read once."""
    css = STYLESHEET.read_text(encoding="utf-8") + strategy_css()
    script = REPORT_SCRIPT.read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return css, script, f"'sha256-{digest}'"


def _json_for_html(data: object) -> str:
    """JSON that is safe inside <script type="application/json">, with every / escaped (so neither
    '</script>' nor a URL appears in the file)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("/", "\\u002f"))


def unlinked(page: str) -> str:
    """User text that looks like a URL or a /static path is kept as text: the colon or slash is
    written as a character reference, which the browser shows unchanged but which no longer reads
    as a reference to anything (the report references nothing outside itself)."""
    return (page.replace("http://", "http&#58;//").replace("https://", "https&#58;//")
            .replace("/static", "&#47;static"))


def report_data(session: SessionDep, run: Run, strategies: list[str], view: ViewParams | None = None) -> dict:
    """What the report's script needs to show any strategy against recompute in the view the link
    names (its layer, head, aggregate and query; the decision's where a strategy's answer has no
    such query token): the tokens, and per strategy the panels' colours and its most-attended notes,
    all computed here (the script computes nothing)."""
    like = view or ViewParams(REFERENCE)
    results = results_with_attention(session, run.id, strategies)

    recompute = attention_vector(results[REFERENCE], REFERENCE).tokens
    data: dict = {REFERENCE: {"tokens": [[t.text, t.segment] for t in recompute]}, "strategies": {}}
    for name in strategies:
        if name == REFERENCE:
            continue
        try:
            panels = heatmap_panels(session, run.id, ViewParams(name, like.layer, like.head, like.agg,
                                                                like.query), results)
        except Unprocessable:  # its answer is shorter than the query's position
            decision = ViewParams(name, like.layer, like.head, like.agg)
            panels = heatmap_panels(session, run.id, decision, results)
        data["strategies"][name] = {
            "tokens": [[t.text, t.segment] for t in panels.res_tokens],
            "paint": paint(panels),
            "top": [{"text": t.text, "inline": t.inline, "segment": t.segment, "before": t.before,
                     "after": t.after, REFERENCE: t.recompute, "strategy": t.strategy, "change": t.change}
                    for t in panels.top],
        }
    return data


@router.get("/runs/{run_id}/report.html")
def report(request: Request, run_id: int, session: SessionDep, asked: ViewDep,
           download: str = "") -> Response:
    """The standalone report: decision table, answers, the heatmaps of the view the link names (and
    any strategy, with its script), the notes map and exactly what was run. `download=1` saves it.
    Built once for a finished run, then served from store with an ETag (`render_cache`)."""
    run = get_or_404(session, Run, run_id, "run")
    return cached(request, session, run, "report.html", lambda: _report(session, run, asked, download),
                  (*VIEW, "download"))


def _report(session: SessionDep, run: Run, asked, download: str) -> Response:
    run_id = run.id
    context = run_context(session, run)
    view = checked_view(run, context, asked)
    css, script, script_hash = report_assets()
    panels = heatmap_panels(session, run.id, view) if view else None
    data = report_data(session, run, context["attention_strategies"], view) if view else {}
    data["run"] = run_view(session, run).model_dump(mode="json")  # the API's run, the same object
    page = templates.get_template("report.html").render(
        **context, view=view, panels=panels, css=css, script=script,
        data_json=_json_for_html(data) if data else "",
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        seq_ramp=[hex_colour(c) for c in seq_stops()], div_ramp=[hex_colour(c) for c in div_stops()],
    )
    policy = (f"default-src 'none'; script-src {script_hash}; style-src 'unsafe-inline'; img-src data:; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    headers = {"Content-Security-Policy": policy,
               **(_download(f"run-{run_id}-report.html") if download else {})}
    return HTMLResponse(unlinked(page), headers=headers)
