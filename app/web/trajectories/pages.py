"""The trajectory pages: the permalink `/trajectories/{id}` (progress k of N turns with Cancel, the
verdicts, the drift, cumulative-TTFT and timeline drawings made on the server, a table per turn),
its progress fragment, its exports (`export.json`: the one `TrajectoryView`; `export.csv`: one row
per turn and strategy; `report.html`: the offline report, self-contained), cancel, and the
notebook's Trajectory panel: the Turns editor (a row per turn, edited on the server by
`turns_form`: add, move, delete, import and show JSONL) and Start."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile as StarletteUpload

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.services.errors import RunLimitReached, Unprocessable
from app.services.prompt_length import unchecked_here
from app.services.trajectories import (
    TrajectoryCreate,
    TrajectoryView,
    TurnIn,
    cancel_trajectory,
    start_trajectory,
    trajectory_view,
)
from app.web.forms import upload_text
from app.web.runs.export_pages import report_assets, unlinked
from app.web.runs.render_cache import cached
from app.web.templating import render, templates
from app.web.trajectories.turns_form import (
    Edited,
    TurnRow,
    apply,
    jsonl_of,
    row_of,
    rows_from_form,
    values_as_of,
)
from app.web.trajectories.view import (
    csv_text,
    cumulative_svg,
    decisive_of,
    drift_svg,
    set_back,
    timeline_svg,
)
from data.models import RUN_ACTIVE, Notebook, Skill
from data.queue import QueueUnavailable
from data.settings import get_settings
from data.trajectories import Trajectory
from vocabulary import EDIT_INFO, REFERENCE
from vocabulary.trajectories import (
    ONE_PER_FIELD,
    VARIANT_SEP,
    carried,
    composite,
    default_keys,
    turns_from_jsonl,
)

router = APIRouter()


def _view(session, trajectory_id: int) -> TrajectoryView:
    return trajectory_view(session, get_or_404(session, Trajectory, trajectory_id, "trajectory"))


def _active(view: TrajectoryView) -> bool:
    return view.status in RUN_ACTIVE


@router.get("/trajectories/{trajectory_id}")
def trajectory_page(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    view = _view(session, trajectory_id)
    return render(request, "trajectory.html", trajectory=view, active=_active(view), drift=drift_svg(view),
                  cumulative=cumulative_svg(view), timeline=timeline_svg(view), reverted=set_back(view),
                  decisive=decisive_of(view), REFERENCE=REFERENCE, nav="runs")


@router.get("/trajectories/{trajectory_id}/progress")
def trajectory_progress(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    """The live fragment; once the trajectory ends, 286 (htmx stops polling) and HX-Refresh."""
    view = _view(session, trajectory_id)
    response = render(request, "_trajectory_progress.html", trajectory=view, active=_active(view))
    if not _active(view):
        response.status_code = 286
        response.headers["HX-Refresh"] = "true"
    return response


@router.post("/trajectories/{trajectory_id}/cancel")
def trajectory_cancel(request: Request, trajectory_id: int, session: SessionDep) -> Response:
    """Cancel before the next turn (the turns read are kept); the page reloads."""
    cancel_trajectory(session, get_or_404(session, Trajectory, trajectory_id, "trajectory"))
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=204, headers={"HX-Refresh": "true"})
    return RedirectResponse(f"/trajectories/{trajectory_id}", status_code=303)


@router.get("/trajectories/{trajectory_id}/export.json")
def trajectory_json(trajectory_id: int, session: SessionDep) -> Response:
    view = _view(session, trajectory_id)
    return Response(view.model_dump_json(indent=1), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="trajectory-{view.id}.json"'})


@router.get("/trajectories/{trajectory_id}/export.csv")
def trajectory_csv(trajectory_id: int, session: SessionDep) -> Response:
    view = _view(session, trajectory_id)
    return Response(csv_text(view), media_type="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="trajectory-{view.id}.csv"'})


def _svg_inline(svg: str) -> str:
    """A drawing for inline HTML: the namespace attribute is not needed there (and names no URL)."""
    return svg.replace(' xmlns="http://www.w3.org/2000/svg"', "")


@router.get("/trajectories/{trajectory_id}/report.html")
def trajectory_report(request: Request, trajectory_id: int, session: SessionDep,
                      download: str = "") -> Response:
    """The offline report: one HTML file (the app's stylesheet and the drawings inline, no script,
    nothing it loads) with the verdicts, the summary, the drift, cumulative-TTFT and timeline
    drawings and a row per turn and strategy. `download=1` saves it. Built once for a finished
    trajectory, then served from store with an ETag (the runs' `render_cache`)."""
    row = get_or_404(session, Trajectory, trajectory_id, "trajectory")
    return cached(request, session, row, "report.html", lambda: _report(session, row, download),
                  ("download",))


def _report(session, row: Trajectory, download: str) -> Response:
    view = trajectory_view(session, row)
    css = report_assets()[0]
    page = templates.get_template("trajectory_report.html").render(
        trajectory=view, css=css, drift=_svg_inline(drift_svg(view)),
        cumulative=_svg_inline(cumulative_svg(view)), timeline=_svg_inline(timeline_svg(view)),
        reverted=set_back(view), decisive=decisive_of(view),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), REFERENCE=REFERENCE)
    policy = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
              "form-action 'none'; frame-ancestors 'none'")
    headers = {"Content-Security-Policy": policy}
    if download:
        headers["Content-Disposition"] = f'attachment; filename="trajectory-{view.id}-report.html"'
    return HTMLResponse(unlinked(page), headers=headers)


# ---- the notebook's Trajectory panel: the Turns editor ------------------------------------------


def _choices_of(notebook: Notebook) -> str:
    return ", ".join(notebook.question.choices) if notebook.question else ""


def _labels(notebook: Notebook) -> list[str]:
    return [f.label for f in notebook.fields if f.label]


def _skill_names(session, notebook: Notebook) -> list[str] | None:
    """The compiled skills a turn may place (the notebook's model's, as its palette lists them), or
    None while the API takes no `skill` in a turn (the select is not drawn then)."""
    if "skill" not in TurnIn.model_fields:
        return None
    compiled = select(Skill.name).where(Skill.model == notebook.model, Skill.status == "compiled")
    return list(dict.fromkeys(session.scalars(compiled.order_by(Skill.name))))


def _panel(request: Request, session, notebook: Notebook, errors: dict[str, str] | None = None,
           form: dict | None = None, status_code: int = 200, edited: Edited | None = None) -> Response:
    rows = session.scalars(select(Trajectory).where(Trajectory.notebook_id == notebook.id)
                           .order_by(Trajectory.id.desc()).limit(10)).all()
    question = notebook.question
    keys = list(carried()) + [f"{n}{VARIANT_SEP}{ONE_PER_FIELD}" for n in carried()
                              if EDIT_INFO[n].appends_errata]
    if notebook.policy_strategy:  # the composite applies the adopted policy; without one it is refused
        keys.append(composite())
    labels = _labels(notebook)
    edited = edited or Edited([TurnRow(fields=dict.fromkeys(labels, ""))])
    errors = errors or {}
    # a turn's problem beside its row; one about a turn the editor does not show goes on top
    beside = {key: message for key, message in errors.items()
              if key.startswith("turns.") and key[6:].isdigit() and int(key[6:]) < len(edited.rows)}
    top = [message for key, message in errors.items() if key.startswith("turns") and key not in beside]
    return render(request, "_trajectory_panel.html", status_code=status_code, notebook=notebook,
                  labels=labels, as_of=values_as_of(edited.rows, _document_values(notebook)),
                  trajectories=rows, errors=errors, beside=beside, top=top, turn_rows=edited.rows,
                  focus=edited.focus, notice=edited.notice,
                  jsonl=jsonl_of(edited.rows) if edited.show_jsonl else None,
                  skills=_skill_names(session, notebook),
                  form=form or {"question": question.text if question else "",
                                "choices": _choices_of(notebook), "strategies": list(default_keys())},
                  keys=keys, max_turns=get_settings().max_turns, unchecked=unchecked_here(notebook.model))


def _document_values(notebook: Notebook) -> dict[str, str]:
    """The notebook's labelled fields' values in its document (label -> value)."""
    return {f.label: f.old_value for f in notebook.fields if f.label}


def _form(data) -> dict:
    return {"question": str(data.get("question", "")), "choices": str(data.get("choices", "")),
            "strategies": [str(s) for s in data.getlist("strategies")]}


@router.get("/notebooks/{notebook_id}/trajectory")
def trajectory_panel(request: Request, notebook_id: int, session: SessionDep) -> Response:
    return _panel(request, session, get_or_404(session, Notebook, notebook_id, "notebook"))


async def _imported(data) -> str:
    """The JSONL to import: the file chosen, else the text pasted."""
    upload = data.get("import_file")
    if isinstance(upload, StarletteUpload) and upload.filename:
        return await upload_text(upload, "import", "import: ")
    return str(data.get("import_text", ""))


@router.post("/notebooks/{notebook_id}/trajectory/turns")
async def trajectory_turns(request: Request, notebook_id: int, session: SessionDep) -> Response:
    """An editing action on the Turns panel (`op`: add, up:i, down:i, delete:i, import, export): the
    panel again with the rows after it; a bad import is a 422 beside the import box, the rows kept.
    Only the form is read on the event loop; the rest runs in a thread (`run_in_threadpool`)."""
    data = await request.form()
    op = str(data.get("op", ""))
    try:
        imported: str | Unprocessable = await _imported(data) if op == "import" else ""
    except Unprocessable as exc:
        imported = exc
    return await run_in_threadpool(_turns, request, session, notebook_id, data, op, imported)


def _turns(request: Request, session, notebook_id: int, data, op: str,
           imported: str | Unprocessable) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    labels = _labels(notebook)
    rows = rows_from_form(data, labels)
    try:
        if isinstance(imported, Unprocessable):
            raise imported
        edited = apply(op, rows, labels, imported)
    except Unprocessable as exc:
        return _panel(request, session, notebook, exc.errors, _form(data), 422, Edited(rows, show_jsonl=True))
    return _panel(request, session, notebook, None, _form(data), 200, edited)


def _checked(body: dict) -> TrajectoryCreate:
    """`body` as the API reads it; `Unprocessable` naming the turn for a bad one ("turn 3: append:
    at most 8000 characters; got 8001")."""
    try:
        return TrajectoryCreate.model_validate(body)
    except ValidationError as exc:
        found: dict[str, str] = {}
        for err in exc.errors():
            loc, message = err.get("loc", ()), str(err.get("msg", "invalid")).removeprefix("Value error, ")
            if len(loc) >= 2 and loc[0] == "turns" and isinstance(loc[1], int):
                what = "".join(f"{part}: " for part in loc[2:])
                found.setdefault(f"turns.{loc[1]}", f"turn {loc[1] + 1}: {what}{message}")
            else:
                found.setdefault(str(loc[0]) if loc else "form", message)
        raise Unprocessable.of(found) from None


@router.post("/notebooks/{notebook_id}/trajectories")
async def trajectory_start(request: Request, notebook_id: int, session: SessionDep,
                           principal: PrincipalDep) -> Response:
    """Start a trajectory from the Turns editor's rows (or, from a plain form, JSONL turns in
    `turns`, one a line); on success go to its page, else the panel again with each problem beside
    its turn or field (nothing saved). The form is read on the event loop; the checks (the prompt
    lengths wait for the counter, `app.services.prompt_length`) and the saving run in a thread."""
    data = await request.form()
    return await run_in_threadpool(_start, request, session, notebook_id, data, principal.name)


def _start(request: Request, session, notebook_id: int, data, created_by: str) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    labels, form = _labels(notebook), _form(data)
    edited = Edited(rows_from_form(data, labels))
    try:
        if "turn_count" in data:
            turns = [row.body() for row in edited.rows]
        else:
            try:
                specs = turns_from_jsonl(str(data.get("turns", "")))
            except ValueError as exc:
                raise Unprocessable("turns", f"turns: {exc}") from None
            turns = [{k: v for k, v in asdict(t).items() if v is not None} for t in specs]
            edited = Edited([row_of(t, labels) for t in specs])
        body = {"turns": turns, "strategies": form["strategies"] or [REFERENCE],
                "question": form["question"],
                "choices": [c.strip() for c in form["choices"].split(",") if c.strip()]}
        row = start_trajectory(session, notebook, _checked(body), created_by)
    except Unprocessable as exc:
        return _panel(request, session, notebook, exc.errors, form, 422, edited)
    except QueueUnavailable as exc:
        return _panel(request, session, notebook, {"form": exc.reason}, form, 503, edited)
    except RunLimitReached as exc:
        return _panel(request, session, notebook, {"form": str(exc)}, form, 429, edited)
    return Response(status_code=204, headers={"HX-Redirect": f"/trajectories/{row.id}"})
