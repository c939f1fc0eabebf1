"""Fields: spans of the document whose value changed. Creating one also creates its generated
erratum; changing one re-renders it (unless it was edited by hand)."""

from __future__ import annotations

from fastapi import APIRouter, status

from app.api.deps import SessionDep, errors, get_or_404
from app.schemas import FieldCreate, FieldOut, FieldPatch
from app.services import notebooks as actions
from data.models import Field, Notebook

router = APIRouter(tags=["fields"])


@router.post(
    "/notebooks/{notebook_id}/fields",
    response_model=FieldOut,
    status_code=status.HTTP_201_CREATED,
    responses=errors(404),
)
def create_field(notebook_id: int, body: FieldCreate, session: SessionDep) -> Field:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    return actions.add_field(session, notebook, body.start, body.end, body.new_value, body.label)


@router.get("/notebooks/{notebook_id}/fields", response_model=list[FieldOut], responses=errors(404))
def list_fields(notebook_id: int, session: SessionDep) -> list[Field]:
    return get_or_404(session, Notebook, notebook_id, "notebook").fields


@router.get("/fields/{field_id}", response_model=FieldOut, responses=errors(404))
def read_field(field_id: int, session: SessionDep) -> Field:
    return get_or_404(session, Field, field_id, "field")


@router.patch("/fields/{field_id}", response_model=FieldOut, responses=errors(404))
def patch_field(field_id: int, body: FieldPatch, session: SessionDep) -> Field:
    field = get_or_404(session, Field, field_id, "field")
    actions.update_field(session, field, body.model_dump(exclude_unset=True, exclude_none=True))
    return field


@router.delete("/fields/{field_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
def remove_field(field_id: int, session: SessionDep) -> None:
    actions.delete_field(session, get_or_404(session, Field, field_id, "field"))
