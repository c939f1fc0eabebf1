"""The home page: the notebooks list, a page at a time, and creating a notebook (paste, upload,
or a bundled example).
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import PrincipalDep, SessionDep
from app.schemas import NotebookCreate
from app.services.errors import Unprocessable
from app.services.notebooks import create_notebook as create_notebook_action
from app.services.unit import saving
from app.web.forms import upload_text, validate
from app.web.notebooks.examples import ExampleError, list_examples, load_example, opened_examples
from app.web.notebooks.home_view import notebook_cards
from app.web.notebooks.sweep_examples import MARK, list_sweep_examples, load_sweep_example
from app.web.paging import page_param
from app.web.templating import render
from data.queue import QueueUnavailable
from data.settings import get_settings

router = APIRouter()


def _index(request: Request, session: SessionDep, status: int = 200, page: int = 1, **extra) -> Response:
    settings = get_settings()
    pager, cards = notebook_cards(session, page)
    examples, sweep_examples = list_examples(), list_sweep_examples()
    context = {
        "notebooks": cards,
        "page": pager,
        "examples": examples,
        "sweep_examples": sweep_examples,
        "opened": opened_examples(session, [ex.slug for ex in examples] + [ex.mark for ex in sweep_examples]),
        "models": settings.models,
        "max_upload_kb": settings.max_upload_bytes // 1024,
        "values": {},
        "errors": {},
        "nav": "notebooks",
    }
    context.update(extra)
    return render(request, "index.html", status, **context)


@router.get("/")
def index(request: Request, session: SessionDep, page: int = page_param(), deleted: str | None = None,
          runs: int | None = Query(default=None, ge=0)) -> Response:
    """The notebooks, a page at a time; after a delete, says what went (`deleted`, `runs`)."""
    return _index(request, session, page=page, deleted=deleted[:200] if deleted else None,
                  deleted_runs=runs or 0)


async def _uploaded_text(file: UploadFile | None) -> str | None:
    """The document inside an upload: .txt/.md as UTF-8 text, .json's `text` or `document` key."""
    if file is None or not file.filename:
        return None
    text = await upload_text(file, "file")
    name = file.filename.lower()
    if name.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise Unprocessable("file", f"{file.filename} is not valid JSON: {exc}") from None
        found = data.get("text", data.get("document")) if isinstance(data, dict) else None
        if not isinstance(found, str):
            raise Unprocessable("file", "a .json upload needs a string under \"text\" or \"document\"")
        return found
    if not name.endswith((".txt", ".md", ".markdown")):
        raise Unprocessable("file", "upload a .txt, .md or .json file")
    return text


@router.post("/notebooks")
async def create_notebook(
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    title: Annotated[str, Form()] = "",
    model: Annotated[str, Form()] = "",
    text: Annotated[str, Form()] = "",
    file: Annotated[UploadFile | None, File()] = None,
) -> Response:
    values = {"title": title, "model": model, "text": text}
    try:
        uploaded: str | None | Unprocessable = await _uploaded_text(file)
    except Unprocessable as exc:
        uploaded = exc
    # the form is read on the event loop; the checks and the saving run in a thread
    return await run_in_threadpool(_create_notebook, request, session, principal.name, values, uploaded)


def _create_notebook(request: Request, session, created_by: str, values: dict[str, str],
                     uploaded: str | None | Unprocessable) -> Response:
    title, model, text = values["title"], values["model"], values["text"]
    try:
        if isinstance(uploaded, Unprocessable):
            raise uploaded
        document = uploaded if uploaded is not None else text  # CRLF becomes LF in the schema
        if not document.strip():
            raise Unprocessable("text", "paste a document or upload a file")
        if model not in get_settings().models:
            raise Unprocessable("model", f"choose one of: {', '.join(get_settings().models)}")
        body = validate(NotebookCreate,
                        {"title": title.strip() or "Untitled", "model": model, "text": document})
    except Unprocessable as exc:
        return _index(request, session, 422, values=values, errors=exc.errors)
    notebook = create_notebook_action(session, body.title, body.model, body.text, created_by)
    return RedirectResponse(f"/notebooks/{notebook.id}", status_code=303)


@router.post("/examples/sweeps/{slug}")
def create_from_sweep_example(request: Request, slug: str, session: SessionDep,
                              principal: PrincipalDep) -> Response:
    """Load a bundled sweep example (or open the notebook already made from it) at its Sweep panel,
    which opens with the example's values filled in."""
    existing = opened_examples(session, [MARK + slug]).get(MARK + slug)
    if existing is not None:
        return RedirectResponse(f"/notebooks/{existing.id}#sweep", status_code=303)
    try:
        with saving(session):
            notebook = load_sweep_example(session, slug, created_by=principal.name)
    except (ExampleError, KeyError, ValueError) as exc:
        return _index(request, session, 422, errors={"form": f"Could not load the example: {exc}"})
    return RedirectResponse(f"/notebooks/{notebook.id}#sweep", status_code=303)


@router.post("/examples/{slug}")
def create_from_example(request: Request, slug: str, session: SessionDep, principal: PrincipalDep,
                        again: Annotated[str, Form()] = "") -> Response:
    """Load a bundled example. When a notebook made from it exists, offer that one instead of a
    silent copy; `again` (the offer's second button) makes a fresh copy anyway."""
    existing = opened_examples(session, [slug]).get(slug)
    if existing is not None and not again:
        return _index(request, session, offer=existing)
    try:
        with saving(session):  # the whole example, or nothing
            notebook = load_example(session, slug, created_by=principal.name)
    except (ExampleError, KeyError, ValueError) as exc:
        return _index(request, session, 422, errors={"form": f"Could not load the example: {exc}"})
    except QueueUnavailable as exc:  # its skills could not be sent to compile: nothing is saved
        return _index(request, session, 503,
                      errors={"form": f"Could not load the example, nothing was saved: {exc.reason}"})
    return RedirectResponse(f"/notebooks/{notebook.id}", status_code=303)
