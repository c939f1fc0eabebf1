"""Managing notebooks and their runs from the pages: rename, duplicate, delete (after a
confirmation page that says the notebook's runs go with it), and "run this snapshot again" from a
notebook's history. Each calls the one service function the JSON API calls too."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import func, select

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.schemas import NotebookPatch
from app.services import notebooks as actions
from app.services.errors import Unprocessable
from app.services.runs import rerun_snapshot
from app.web.errors import error_page
from app.web.forms import validate
from app.web.notebooks.context import notebook_context
from app.web.templating import render
from data.models import Notebook, Run
from data.queue import QueueUnavailable

router = APIRouter()


@router.post("/notebooks/{notebook_id}/rename")
def rename(request: Request, notebook_id: int, session: SessionDep,
           title: Annotated[str, Form()] = "") -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    try:
        body = validate(NotebookPatch, {"title": title.strip()})
        if body.title is None:
            raise Unprocessable("title", "give the notebook a title")
        actions.rename_notebook(notebook, body.title)
    except Unprocessable as exc:
        context = notebook_context(session, notebook)
        context.update(run=context["recent_runs"][0] if context["recent_runs"] else None, compact=True,
                       rename_errors=exc.errors, rename_value=title)
        return render(request, "notebook.html", 422, **context)
    return RedirectResponse(f"/notebooks/{notebook.id}", status_code=303)


@router.post("/notebooks/{notebook_id}/duplicate")
def duplicate(notebook_id: int, session: SessionDep, principal: PrincipalDep) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    copy = actions.duplicate_notebook(session, notebook, created_by=principal.name)
    return RedirectResponse(f"/notebooks/{copy.id}", status_code=303)


@router.get("/notebooks/{notebook_id}/delete")
def confirm_delete(request: Request, notebook_id: int, session: SessionDep) -> Response:
    """The confirmation: what goes with the notebook (its runs among it), and the two ways out."""
    notebook = actions.load_for_page(get_or_404(session, Notebook, notebook_id, "notebook"))
    runs = session.scalar(select(func.count(Run.id)).where(Run.notebook_id == notebook.id)) or 0
    return render(request, "confirm_delete.html", notebook=notebook, run_count=runs, nav="notebooks")


@router.post("/notebooks/{notebook_id}/delete")
def delete(notebook_id: int, session: SessionDep) -> Response:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    runs = session.scalar(select(func.count(Run.id)).where(Run.notebook_id == notebook.id)) or 0
    title = notebook.title
    actions.delete_notebook(session, notebook)
    return RedirectResponse(f"/?deleted={quote(title[:200])}&runs={runs}", status_code=303)


@router.post("/runs/{run_id}/rerun")
def rerun(request: Request, run_id: int, session: SessionDep, principal: PrincipalDep) -> Response:
    """A new run of exactly this run's snapshot (not the notebook as it is now)."""
    run = get_or_404(session, Run, run_id, "run")
    try:
        again = rerun_snapshot(session, run, principal.name)
    except QueueUnavailable as exc:
        return error_page(request, 503, f"The run could not be queued, nothing was saved: {exc.reason}")
    return RedirectResponse(f"/runs/{again.id}", status_code=303)
