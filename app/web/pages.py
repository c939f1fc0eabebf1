"""The HTML side of kvnotes: the notebooks list and creating a notebook (paste, upload, or a
bundled example). The notebook, run and skill pages live in their own modules and are included
here, so `app.main` mounts one `router`.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep
from app.schemas import NotebookCreate
from app.services.errors import Unprocessable
from app.services.notebooks import create_notebook as create_notebook_action
from app.web import account_pages, components, notebook_pages, run_pages, skill_pages
from app.web.examples import ExampleError, list_examples, load_example
from app.web.forms import validate
from app.web.templating import render
from data.models import Notebook, Run
from data.queue import QueueUnavailable
from data.settings import get_settings

router = APIRouter(include_in_schema=False)
for _module in (account_pages, notebook_pages, run_pages, skill_pages, components):
    router.include_router(_module.router, include_in_schema=False)


def _index(request: Request, session: SessionDep, status: int = 200, **extra) -> Response:
    settings = get_settings()
    notebooks = list(session.scalars(select(Notebook).order_by(Notebook.updated_at.desc(), Notebook.id.desc())))
    context = {
        "notebooks": notebooks,
        "examples": list_examples(),
        "models": settings.models,
        "max_upload_kb": settings.max_upload_bytes // 1024,
        "values": {},
        "errors": {},
        "nav": "notebooks",
    }
    context.update(extra)
    return render(request, "index.html", status, **context)


@router.get("/")
def index(request: Request, session: SessionDep) -> Response:
    return _index(request, session)


async def _uploaded_text(file: UploadFile | None) -> str | None:
    """The document inside an upload: .txt/.md as UTF-8 text, .json's `text` or `document` key."""
    if file is None or not file.filename:
        return None
    limit = get_settings().max_upload_bytes
    raw = await file.read(limit + 1)
    if len(raw) > limit:
        raise Unprocessable("file", f"the file is larger than {limit // 1024} KB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unprocessable("file", f"{file.filename} is not UTF-8 text") from None
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
        uploaded = await _uploaded_text(file)
        document = uploaded if uploaded is not None else text  # CRLF becomes LF in the schema
        if not document.strip():
            raise Unprocessable("text", "paste a document or upload a file")
        if model not in get_settings().models:
            raise Unprocessable("model", f"choose one of: {', '.join(get_settings().models)}")
        body = validate(NotebookCreate, {"title": title.strip() or "Untitled", "model": model, "text": document})
    except Unprocessable as exc:
        return _index(request, session, 422, values=values, errors=exc.errors)
    notebook = create_notebook_action(session, body.title, body.model, body.text, principal.name)
    session.commit()
    return RedirectResponse(f"/notebooks/{notebook.id}", status_code=303)


@router.post("/examples/{slug}")
def create_from_example(request: Request, slug: str, session: SessionDep, principal: PrincipalDep) -> Response:
    try:
        notebook = load_example(session, slug, created_by=principal.name)
        session.commit()
    except (ExampleError, KeyError, ValueError) as exc:
        session.rollback()
        return _index(request, session, 422, errors={"form": f"Could not load the example: {exc}"})
    except QueueUnavailable as exc:  # its skills could not be sent to compile: nothing is saved
        session.rollback()
        return _index(request, session, 503, errors={"form": f"Could not load the example, nothing was saved: {exc.reason}"})
    return RedirectResponse(f"/notebooks/{notebook.id}", status_code=303)


@router.get("/runs")
def runs_page(request: Request, session: SessionDep) -> Response:
    runs = list(session.scalars(select(Run).order_by(Run.id.desc()).limit(100)))
    return render(request, "runs.html", recent_runs=runs, nav="runs")
