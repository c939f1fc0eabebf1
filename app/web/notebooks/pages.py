"""The notebook page and the htmx fragments that edit it: fields from a mouse selection,
errata (edit, add, reorder, remove), skill placements (drop, move, remove), saving the question and
starting a run.

Every edit goes through the same services and schemas as the JSON API. On success the response
swaps the dependent regions out of band (`regions`); on failure the form comes back with the
server's message beside the field that caused it and everything typed kept (HTTP 422).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session

from app import schemas
from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.schemas import ErratumCreate, ErratumPatch, FieldCreate, FieldPatch, PlacementCreate, RunCreate
from app.services import notebooks as actions
from app.services.errors import RunLimitReached, Unprocessable
from app.services.runs import question_for, start_run, waits_without_worker, worker_step
from app.services.unit import saving
from app.web.forms import lines, parse_int, validate
from app.web.notebooks.context import decision_summary, latest_tokens, notebook_context, regions
from app.web.notebooks.document_view import hover_tokens, paragraph_starts
from app.web.paging import page_param
from app.web.templating import count, render
from data.models import Erratum, Field, Notebook, Placement, Skill
from data.queue import QueueUnavailable
from vocabulary import ERRATUM, REFERENCE

router = APIRouter()
Text = Annotated[str, Form()]
OptText = Annotated[str | None, Form()]


def _notebook(session: SessionDep, notebook_id: int) -> Notebook:
    return get_or_404(session, Notebook, notebook_id, "notebook")


@router.get("/notebooks/{notebook_id}")
def notebook_page(request: Request, notebook_id: int, session: SessionDep,
                  history: int = page_param(),
                  sweeps: bool = Query(default=False, description="the history lists the sweeps' edits too"),
                  ) -> Response:
    notebook = _notebook(session, notebook_id)
    context = notebook_context(session, notebook, history, sweeps=sweeps)
    context["run"] = context["recent_runs"][0] if context["recent_runs"] else None
    context["summary"] = decision_summary(session, context["run"])
    context["compact"] = True
    return render(request, "notebook.html", **context)


@router.get("/notebooks/{notebook_id}/tokens.json")
def notebook_tokens(notebook_id: int, session: SessionDep) -> JSONResponse:
    """Document tokens of the latest finished run that fits the document as it is now."""
    notebook = _notebook(session, notebook_id)
    run, tokens = latest_tokens(session, notebook)
    return JSONResponse({"run_id": run.id if run else None, "tokens": hover_tokens(tokens)})


# --- one way to save an edit ----------------------------------------------------------------------


def _save(request: Request, session: Session, notebook: Notebook, edit: Callable[[], object],
          failed: Callable[[dict[str, str]], Response] | None = None) -> Response:
    """Apply `edit` as one transaction (`saving`), answering with every region that depends on it
    (swapped out of band); or, when it raises `Unprocessable`, save nothing (rolled back) and answer
    `failed(errors)` (422) — by default the messages as JSON, for the scripts that drag and drop."""
    try:
        with saving(session):
            edit()
    except Unprocessable as exc:
        if failed is None:
            return JSONResponse({"detail": exc.message}, status_code=422)
        return failed(exc.errors)
    return regions(request, session, notebook)


def _child(session: Session, model: type, ident: int, notebook: Notebook, name: str):
    """Row `ident` of `model`, which must belong to `notebook` (404 otherwise)."""
    row = get_or_404(session, model, ident, name)
    if row.notebook_id != notebook.id:
        raise HTTPException(status_code=404, detail=f"{name} {ident} not found in notebook {notebook.id}")
    return row


# --- fields ----------------------------------------------------------------------------------------


@router.post("/notebooks/{notebook_id}/fields")
def create_field(
    request: Request, notebook_id: int, session: SessionDep,
    start: OptText = None, end: OptText = None, new_value: Text = "", label: Text = "", selected: Text = "",
) -> Response:
    notebook = _notebook(session, notebook_id)
    values = {"start": start or "", "end": end or "", "new_value": new_value, "label": label,
              "selected": selected}

    def add() -> None:
        s, e = parse_int(start, "start"), parse_int(end, "end")
        if s is None or e is None:
            raise Unprocessable("start", "select a span of the document first")
        if selected and notebook.document[s:e] != selected:
            raise Unprocessable("start",
                                "the selection no longer matches the document; select the span again")
        if not new_value.strip():
            raise Unprocessable("new_value", "give the field its new value")
        body = validate(FieldCreate, {"start": s, "end": e, "new_value": new_value, "label": label})
        actions.add_field(session, notebook, body.start, body.end, body.new_value, body.label)

    return _save(request, session, notebook, add, lambda errors: render(
        request, "_selection_form.html", 422, notebook=notebook, values=values, errors=errors))


@router.post("/notebooks/{notebook_id}/fields/find")
def create_field_by_search(
    request: Request, notebook_id: int, session: SessionDep,
    find: Text = "", occurrence: Text = "1", new_value: Text = "", label: Text = "",
) -> Response:
    """A field without a mouse: the `occurrence`-th appearance (1 = first) of `find` in the document."""
    notebook = _notebook(session, notebook_id)
    values = {"find": find, "occurrence": occurrence, "new_value": new_value, "label": label}
    try:
        start, end = actions.find_span(notebook.document, find, parse_int(occurrence, "occurrence") or 1)
        if not new_value.strip():
            raise Unprocessable("new_value", "give the field its new value")
        body = validate(FieldCreate, {"start": start, "end": end, "new_value": new_value, "label": label})
        actions.add_field(session, notebook, body.start, body.end, body.new_value, body.label)
    except Unprocessable as exc:
        return render(request, "_find_field.html", 422, notebook=notebook, find_values=values,
                      find_errors=exc.errors, find_open=True)
    shown = find if len(find) <= 40 else find[:39] + "…"
    return regions(request, session, notebook, find_open=True,
                   find_done=f"Made a field of “{shown}” at characters {start}–{end}.")


@router.post("/notebooks/{notebook_id}/fields/{field_id}")
def edit_field(
    request: Request, notebook_id: int, field_id: int, session: SessionDep,
    new_value: Text = "", label: Text = "",
) -> Response:
    notebook = _notebook(session, notebook_id)
    field = _child(session, Field, field_id, notebook, "field")

    def change() -> None:
        if not new_value.strip():
            raise Unprocessable("new_value", "give the field its new value")
        body = validate(FieldPatch, {"new_value": new_value, "label": label})
        actions.update_field(session, field, body.model_dump(exclude_none=True))

    return _save(request, session, notebook, change, lambda errors: render(
        request, "_field_item.html", 422, notebook=notebook, f=field,
        item_id=field.id, item_errors=errors, item_values={"new_value": new_value, "label": label}))


@router.post("/notebooks/{notebook_id}/fields/{field_id}/delete")
def remove_field(request: Request, notebook_id: int, field_id: int, session: SessionDep) -> Response:
    notebook = _notebook(session, notebook_id)
    field = _child(session, Field, field_id, notebook, "field")
    return _save(request, session, notebook, lambda: actions.delete_field(session, field))


# --- errata ----------------------------------------------------------------------------------------


def _errata_panel(request: Request, notebook: Notebook, **extra) -> Response:
    return render(request, "_errata.html", 422, notebook=notebook, **extra)


@router.post("/notebooks/{notebook_id}/errata")
def add_erratum(request: Request, notebook_id: int, session: SessionDep, text: Text = "") -> Response:
    notebook = _notebook(session, notebook_id)

    def add() -> None:
        if not text.strip():
            raise Unprocessable("text", "write the correction to append")
        body = validate(ErratumCreate, {"text": text})
        actions.add_custom_erratum(session, notebook, body.text)

    return _save(request, session, notebook, add, lambda errors: _errata_panel(
        request, notebook, new_errors=errors, new_values={"text": text}))


@router.post("/notebooks/{notebook_id}/errata/{erratum_id}")
def edit_erratum(request: Request, notebook_id: int, erratum_id: int, session: SessionDep,
                 text: Text = "") -> Response:
    notebook = _notebook(session, notebook_id)
    erratum = _child(session, Erratum, erratum_id, notebook, ERRATUM)

    def change() -> None:
        if not text.strip():
            raise Unprocessable("text", "an erratum cannot be empty; remove it instead")
        actions.set_erratum_text(erratum, validate(ErratumPatch, {"text": text}).text)

    return _save(request, session, notebook, change, lambda errors: _errata_panel(
        request, notebook, item_id=erratum.id, item_errors=errors, item_values={"text": text}))


@router.post("/notebooks/{notebook_id}/errata/{erratum_id}/move")
def move_erratum(request: Request, notebook_id: int, erratum_id: int, session: SessionDep,
                 move: Text = "0") -> Response:
    """One place up (`move` = -1) or down (1)."""
    notebook = _notebook(session, notebook_id)
    _child(session, Erratum, erratum_id, notebook, ERRATUM)
    ids = [e.id for e in notebook.errata]
    i = ids.index(erratum_id)
    j = min(max(i + (1 if move.strip() == "1" else -1), 0), len(ids) - 1)
    ids[i], ids[j] = ids[j], ids[i]
    return _save(request, session, notebook, lambda: actions.reorder_errata(notebook, ids))


@router.post("/notebooks/{notebook_id}/errata/{erratum_id}/delete")
def remove_erratum(request: Request, notebook_id: int, erratum_id: int, session: SessionDep) -> Response:
    notebook = _notebook(session, notebook_id)
    erratum = _child(session, Erratum, erratum_id, notebook, ERRATUM)
    return _save(request, session, notebook, lambda: actions.delete_erratum(session, erratum))


# --- placements ------------------------------------------------------------------------------------


@router.post("/notebooks/{notebook_id}/placements")
def place_skill(
    request: Request, notebook_id: int, session: SessionDep, skill_id: OptText = None,
    position: OptText = None,
) -> Response:
    """Drop a compiled skill at a character offset (empty: at the end)."""
    notebook = _notebook(session, notebook_id)

    def place() -> None:
        body = validate(PlacementCreate, {"skill_id": parse_int(skill_id, "skill_id"),
                                          "position": parse_int(position, "position")})
        skill = get_or_404(session, Skill, body.skill_id, "skill")
        actions.add_placement(notebook, skill, body.position)  # compiled, for this model (the API's rule too)

    return _save(request, session, notebook, place)


@router.post("/notebooks/{notebook_id}/placements/{placement_id}/move")
def move_placement(
    request: Request, notebook_id: int, placement_id: int, session: SessionDep,
    position: OptText = None, step: OptText = None,
) -> Response:
    """Move to `position` (empty: the end), or one paragraph up/down with `step` = -1 / 1."""
    notebook = _notebook(session, notebook_id)
    placement = _child(session, Placement, placement_id, notebook, "placement")

    def move() -> None:
        if step is not None and step.strip():
            new_position = _step(notebook, placement.position, parse_int(step, "step") or 0)
        else:
            new_position = parse_int(position, "position")
        actions.move_placement(placement, new_position)

    return _save(request, session, notebook, move)


def _step(notebook: Notebook, position: int | None, step: int) -> int | None:
    """The neighbouring drop spot: paragraph starts, then the end (None)."""
    spots: list[int | None] = [0, *paragraph_starts(notebook.document), None]
    here = (len(spots) - 1 if position is None
            else max(i for i, p in enumerate(spots) if p is not None and p <= position))
    return spots[min(max(here + step, 0), len(spots) - 1)]


@router.post("/notebooks/{notebook_id}/placements/{placement_id}/delete")
def remove_placement(request: Request, notebook_id: int, placement_id: int, session: SessionDep) -> Response:
    notebook = _notebook(session, notebook_id)
    placement = _child(session, Placement, placement_id, notebook, "placement")
    return _save(request, session, notebook, lambda: actions.delete_placement(session, placement))


# --- the question and runs ------------------------------------------------------------------------


@router.post("/notebooks/{notebook_id}/question")
def save_question(request: Request, notebook_id: int, session: SessionDep, question: Text = "",
                  choices: Text = "", cot: OptText = None, attribution: OptText = None,
                  strategies: Annotated[list[str] | None, Form()] = None) -> Response:
    """The run form's *Save question*: the question and its choices become the notebook's current
    ones without a run (the replay and the API's runs use them); the form comes back with a note."""
    notebook = _notebook(session, notebook_id)
    values = {"question": question, "choices": choices, "cot": bool(cot), "attribution": bool(attribution),
              "strategies": strategies or [REFERENCE]}
    try:
        if not question.strip():
            raise Unprocessable("question", "write the question to save")
        asked = {"text": question.strip(), "choices": lines(choices), "cot": bool(cot)}
        body = validate(schemas.QuestionIn, asked, rename={"text": "question"})
        actions.set_question(notebook, body.text, body.choices, body.cot)
    except Unprocessable as exc:
        session.rollback()
        context = notebook_context(session, notebook, run_values=values)
        return render(request, "_run_form.html", 422, **context, run_errors=exc.errors)
    context = notebook_context(session, notebook, run_values=values)
    saved = count(len(body.choices), "choice") if body.choices else "a free answer"
    return render(request, "_run_form.html", **context, run_saved=f"Saved: the question, with {saved}.")


@router.post("/notebooks/{notebook_id}/runs")
def create_run(
    request: Request, notebook_id: int, session: SessionDep, principal: PrincipalDep,
    question: Text = "", choices: Text = "", cot: OptText = None, attribution: OptText = None,
    mechanism: OptText = None, strategies: Annotated[list[str] | None, Form()] = None,
) -> Response:
    notebook = _notebook(session, notebook_id)
    chosen = strategies or [REFERENCE]
    values = {"question": question, "choices": choices, "cot": bool(cot), "attribution": bool(attribution),
              "mechanism": bool(mechanism), "strategies": chosen}
    context = notebook_context(session, notebook, run_values=values)
    try:
        if not question.strip():
            raise Unprocessable("question", "ask the question whose decision you want to compare")
        body = validate(RunCreate, {"question": question.strip(), "choices": lines(choices), "cot": bool(cot),
                                    "attribution": bool(attribution), "mechanism": bool(mechanism),
                                    "strategies": chosen})
        asked = question_for(notebook, body)
        run = start_run(session, notebook, asked, body.strategies, body.attribution, principal.name,
                        mechanism=body.mechanism)
    except Unprocessable as exc:
        session.rollback()
        context["run_errors"] = exc.errors
        return render(request, "_run_form.html", 422, **context)
    except QueueUnavailable as exc:
        context["run_errors"] = {"form": f"The run could not be queued, nothing was saved: {exc.reason}"}
        return render(request, "_run_form.html", 503, **context)
    except RunLimitReached as exc:
        context["run_errors"] = {"form": f"The run was not started: {exc}"}
        return render(request, "_run_form.html", 429, **context)
    return render(request, "_run_started.html", **context, run=run, compact=True,
                  no_live_worker=waits_without_worker(session, run), worker_step=worker_step(session, run))
