"""Notebooks: create, list, read, update (rename), duplicate, delete; and the notebook's current question."""

from __future__ import annotations

from fastapi import APIRouter, Query, status
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import NotebookCreate, NotebookOut, NotebookPatch, NotebookSummary, QuestionIn, QuestionOut
from app.services import notebooks as actions
from app.services.notebook_view import notebook_view
from data.models import Notebook, Question

router = APIRouter(tags=["notebooks"])


@router.post("/notebooks", response_model=NotebookOut, status_code=status.HTTP_201_CREATED)
def create_notebook(body: NotebookCreate, session: SessionDep, principal: PrincipalDep) -> NotebookOut:
    notebook = actions.create_notebook(session, body.title, body.model, body.text, principal.name)
    return notebook_view(notebook)


@router.get("/notebooks", response_model=list[NotebookSummary])
def list_notebooks(
    session: SessionDep,
    limit: int = Query(default=100, ge=1, le=1000,
                       description="at most this many, most recently edited first"),
    offset: int = Query(default=0, ge=0, le=2**62, description="skip this many"),
) -> list[Notebook]:
    query = (select(Notebook).order_by(Notebook.updated_at.desc(), Notebook.id.desc())
             .limit(limit).offset(offset))
    return list(session.scalars(query))


@router.get("/notebooks/{notebook_id}", response_model=NotebookOut, responses=errors(404))
def read_notebook(notebook_id: int, session: SessionDep) -> NotebookOut:
    return notebook_view(get_or_404(session, Notebook, notebook_id, "notebook"))


@router.patch("/notebooks/{notebook_id}", response_model=NotebookOut, responses=errors(404))
def update_notebook(notebook_id: int, body: NotebookPatch, session: SessionDep) -> NotebookOut:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    actions.update_notebook(session, notebook, body.text, body.title, body.model)
    return notebook_view(notebook)


@router.post("/notebooks/{notebook_id}/duplicate", response_model=NotebookOut,
             status_code=status.HTTP_201_CREATED, responses=errors(404))
def duplicate_notebook(notebook_id: int, session: SessionDep, principal: PrincipalDep) -> NotebookOut:
    """A copy with the same document, fields, errata, skill placements and question; no runs."""
    copy = actions.duplicate_notebook(session, get_or_404(session, Notebook, notebook_id, "notebook"),
                                      created_by=principal.name)
    return notebook_view(copy)


@router.delete("/notebooks/{notebook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
def delete_notebook(notebook_id: int, session: SessionDep) -> None:
    """Deletes the notebook, its fields, errata, placements, questions and runs."""
    actions.delete_notebook(session, get_or_404(session, Notebook, notebook_id, "notebook"))


@router.put("/notebooks/{notebook_id}/question", response_model=QuestionOut, responses=errors(404))
def set_question(notebook_id: int, body: QuestionIn, session: SessionDep) -> Question:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    return actions.set_question(notebook, body.text, body.choices, body.cot)
