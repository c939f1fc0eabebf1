"""The sweep pages: the permalink `/sweeps/{id}` (progress "k of N edits", Cancel, the threshold
moved without running anything again, the frontier drawn on the server, the table, the policy and
the worst cases), its progress fragment, its exports (`export.json`: the one `SweepView`;
`export.csv`: one row per edit and strategy; `report.html`: the offline report, self-contained),
and the notebook's Sweep panel (values per field typed or generated, or a CSV / JSONL upload;
values outside the choices refused or, ticked, added to them; stop when decided, ticked by default)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from anyio import from_thread
from fastapi import APIRouter, File, Query, Request, UploadFile
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.services.errors import RunLimitReached, Unprocessable
from app.services.sweep_input import SweepCreate, rows_from_upload
from app.services.sweep_view import SweepView, build_sweep_view
from app.services.sweeps import adopt_policy, cancel_sweep, drop_policy, start_sweep
from app.web.forms import parse_int, parse_number, upload_text, validate
from app.web.notebooks.sweep_examples import sweep_example_of
from app.web.sweeps.view import csv_text, frontier_svg
from app.web.templating import render
from data.models import RUN_ACTIVE, Notebook, Sweep
from data.queue import QueueUnavailable
from data.settings import get_settings
from vocabulary import REFERENCE
from vocabulary.sweep_values import KIND_HELP, KINDS
from vocabulary.sweeps import DEFAULT_THRESHOLD, SWEEP_STRATEGIES

router = APIRouter()
Threshold = Annotated[float | None, Query(gt=0.0, lt=1.0)]


def _view(session, sweep_id: int, threshold: float | None = None) -> SweepView:
    return build_sweep_view(session, get_or_404(session, Sweep, sweep_id, "sweep"), threshold)


def _download(name: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}"'}


@router.get("/sweeps/{sweep_id}")
def sweep_page(request: Request, sweep_id: int, session: SessionDep, threshold: Threshold = None) -> Response:
    view = _view(session, sweep_id, threshold)
    return render(request, "sweep.html", sweep=view, frontier=frontier_svg(view), nav="runs")


@router.get("/sweeps/{sweep_id}/progress")
def sweep_progress(request: Request, sweep_id: int, session: SessionDep) -> Response:
    """The live fragment (k of N edits, and the policy box so far, swapped in out of band at the
    threshold the page shows: its `?threshold=`, read from htmx's HX-Current-URL); once the sweep
    ends, 286 (htmx stops polling) and HX-Refresh."""
    view = _view(session, sweep_id, _page_threshold(request))
    response = render(request, "_sweep_progress.html", sweep=view, poll=True)
    if not view.active:
        response.status_code = 286
        response.headers["HX-Refresh"] = "true"
    return response


@router.post("/sweeps/{sweep_id}/cancel")
def sweep_cancel(request: Request, sweep_id: int, session: SessionDep) -> Response:
    """Cancel the unfinished edits; the page reloads (htmx) or is redirected to (a plain form)."""
    cancel_sweep(session, get_or_404(session, Sweep, sweep_id, "sweep"))
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=204, headers={"HX-Refresh": "true"})
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)


@router.post("/sweeps/{sweep_id}/adopt")
async def sweep_adopt(request: Request, sweep_id: int, session: SessionDep) -> Response:
    """The notebook adopts the finished sweep's policy at the page's threshold (with `per_field=1`,
    each field's own policy too); its page shows it.
    A sweep still running (or with nothing finished) gets its page again with the reason (422)."""
    form = await request.form()
    return await run_in_threadpool(_adopt, request, session, sweep_id, form)


def _adopt(request: Request, session, sweep_id: int, form) -> Response:
    sweep = get_or_404(session, Sweep, sweep_id, "sweep")
    try:
        threshold = parse_number(str(form.get("threshold", "")) or None, "threshold", sweep.threshold)
        notebook = adopt_policy(session, sweep, threshold, per_field=form.get("per_field") == "1")
    except Unprocessable as exc:
        view = _view(session, sweep_id)
        return render(request, "sweep.html", sweep=view, frontier=frontier_svg(view), nav="runs",
                      adopt_error=exc.message, status_code=422)
    return _go(request, f"/notebooks/{notebook.id}#adopted-policy")


@router.post("/notebooks/{notebook_id}/policy/drop")
def policy_drop(request: Request, notebook_id: int, session: SessionDep) -> Response:
    """Forget the adopted policy: `auto` is the oracle pick again."""
    drop_policy(session, get_or_404(session, Notebook, notebook_id, "notebook"))
    return _go(request, f"/notebooks/{notebook_id}")


def _go(request: Request, url: str) -> Response:
    """To `url`: htmx follows HX-Redirect, a plain form a 303."""
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=204, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


@router.get("/sweeps/{sweep_id}/export.json")
def sweep_json(sweep_id: int, session: SessionDep, threshold: Threshold = None) -> Response:
    view = _view(session, sweep_id, threshold)
    return Response(view.model_dump_json(indent=1), media_type="application/json",
                    headers=_download(f"sweep-{sweep_id}.json"))


@router.get("/sweeps/{sweep_id}/export.csv")
def sweep_csv(sweep_id: int, session: SessionDep, threshold: Threshold = None) -> Response:
    view = _view(session, sweep_id, threshold)
    return Response(csv_text(view), media_type="text/csv; charset=utf-8",
                    headers=_download(f"sweep-{sweep_id}.csv"))


@router.get("/sweeps/{sweep_id}/report.html")
def sweep_report(request: Request, sweep_id: int, session: SessionDep,
                 threshold: Threshold = None, download: str = "") -> Response:
    """The offline report: one HTML file, no scripts and no links it needs, the frontier drawn. It
    opens in the browser, as the runs' and trajectories' reports do; `download=1` saves it."""
    view = _view(session, sweep_id, threshold)
    response = render(request, "sweep_report.html", sweep=view, frontier=frontier_svg(view))
    if download:
        response.headers.update(_download(f"sweep-{sweep_id}.html"))
    return response


# ---- the notebook's Sweep panel ---------------------------------------------------------------


def _panel(request: Request, session, notebook: Notebook, errors: dict[str, str] | None = None,
           form: dict | None = None, status_code: int = 200) -> Response:
    sweeps = session.scalars(select(Sweep).where(Sweep.notebook_id == notebook.id)
                             .order_by(Sweep.id.desc()).limit(10)).all()
    question = notebook.question
    fields = [f for f in notebook.fields if f.label]
    if form is None:
        form = {"question": question.text if question else "",
                "choices": ", ".join(question.choices) if question else "",
                "strategies": list(SWEEP_STRATEGIES), "threshold": "0.95",
                "stop_when_decided": True, "extend_choices": False}
        example = sweep_example_of(notebook)
        if example is not None and not sweeps:  # a sweep example, before its first sweep: its values
            form.update({f"values_{i}": "\n".join(example.values.get(f.label, ()))
                         for i, f in enumerate(fields)},
                        strategies=list(example.strategies), threshold=f"{example.threshold:.2f}",
                        stop_when_decided=example.stop_when_decided)
    return render(request, "_sweep_panel.html", status_code=status_code, notebook=notebook,
                  fields=fields, sweeps=sweeps, errors=errors or {}, form=form,
                  strategies=list(SWEEP_STRATEGIES), active=RUN_ACTIVE, kinds=KIND_HELP,
                  max_edits=get_settings().max_sweep_edits)


@router.get("/notebooks/{notebook_id}/sweep")
def sweep_panel(request: Request, notebook_id: int, session: SessionDep) -> Response:
    return _panel(request, session, get_or_404(session, Notebook, notebook_id, "notebook"))


@router.post("/notebooks/{notebook_id}/sweeps")
async def sweep_start(request: Request, notebook_id: int, session: SessionDep, principal: PrincipalDep,
                      upload: Annotated[UploadFile | None, File()] = None) -> Response:
    """Start a sweep from the panel's form; on success go to its page, else the panel again with
    each problem beside its field (nothing saved). The form is read on the event loop, the rest runs
    in a thread (its files read back on the loop: `from_thread.run`)."""
    data = await request.form()
    return await run_in_threadpool(_sweep_start, request, session, notebook_id, data, upload, principal.name)


def _sweep_start(request: Request, session, notebook_id: int, data, upload: UploadFile | None,
                 created_by: str) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    fields = [f for f in notebook.fields if f.label]
    gen_keys = ("kind", "count", "start", "end", "places", "seed")
    form = {"question": str(data.get("question", "")), "choices": str(data.get("choices", "")),
            "strategies": [str(s) for s in data.getlist("strategies")],
            "threshold": str(data.get("threshold", "0.95")),
            "stop_when_decided": data.get("stop_when_decided") == "1",
            "extend_choices": data.get("extend_choices") == "1",
            **{f"values_{i}": str(data.get(f"values_{i}", "")) for i in range(len(fields))},
            **{f"gen_{k}_{i}": str(data.get(f"gen_{k}_{i}", ""))
               for k in gen_keys for i in range(len(fields))}}
    try:
        body = {"question": form["question"], "strategies": form["strategies"] or [REFERENCE],
                "threshold": parse_number(form["threshold"], "threshold", DEFAULT_THRESHOLD),
                "choices": [c.strip() for c in form["choices"].split(",") if c.strip()],
                "stop_when_decided": form["stop_when_decided"], "extend_choices": form["extend_choices"]}
        if upload is not None and upload.filename:
            body["edits"] = rows_from_upload(from_thread.run(upload_text, upload, "upload"), upload.filename)
        else:
            body["values"] = {f.label: [v.strip() for v in form[f"values_{i}"].splitlines() if v.strip()]
                              for i, f in enumerate(fields) if form[f"values_{i}"].strip()}
            generate = [from_thread.run(_generator, data, form, i, f.label) for i, f in enumerate(fields)
                        if form[f"gen_kind_{i}"] in KINDS]
            if generate:
                body["generate"] = generate
            if not body["values"] and not generate:
                raise Unprocessable("values", "give values for at least one field, one per line, "
                                              "generate them, or upload a CSV / JSONL file")
        sweep = start_sweep(session, notebook, validate(SweepCreate, body), created_by)
    except Unprocessable as exc:
        return _panel(request, session, notebook, exc.errors, form, 422)
    except QueueUnavailable as exc:
        return _panel(request, session, notebook, {"form": exc.reason}, form, 503)
    except RunLimitReached as exc:
        return _panel(request, session, notebook, {"form": str(exc)}, form, 429)
    return Response(status_code=204, headers={"HX-Redirect": f"/sweeps/{sweep.id}"})


async def _generator(data, form: dict, i: int, label: str) -> dict:
    """The panel's generator for field `i` as the API's `generate` item; lines come from the
    field's uploaded list (one value a line)."""
    where = f"generate.{label}"
    count = parse_int(form[f"gen_count_{i}"], "count")
    if count is None:
        raise Unprocessable(where, f"say how many values to generate for {label!r}")
    item = {"field": label, "kind": form[f"gen_kind_{i}"], "count": count,
            "start": form[f"gen_start_{i}"] or None, "end": form[f"gen_end_{i}"] or None,
            "places": parse_int(form[f"gen_places_{i}"], "places") or 2,
            "seed": parse_int(form[f"gen_seed_{i}"], "seed") or 0}
    upload = data.get(f"gen_lines_{i}")
    if item["kind"] == "lines":
        if upload is None or isinstance(upload, str) or not upload.filename:
            raise Unprocessable(where, f"upload a list of values for {label!r}, one a line")
        text = await upload_text(upload, where, f"{label!r}'s list: ")
        item["lines"] = [line.strip() for line in text.splitlines() if line.strip()]
    return item


def _page_threshold(request: Request) -> float | None:
    """The threshold the polling page was opened at (`?threshold=` of its URL), when it is one."""
    query = urlsplit(request.headers.get("HX-Current-URL", "")).query
    try:
        value = float(parse_qs(query).get("threshold", [""])[0])
    except ValueError:
        return None
    return value if 0.0 < value < 1.0 else None
