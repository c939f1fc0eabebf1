"""Errata: corrections appended after the document, in the order the notebook gives them."""

from __future__ import annotations

from fastapi import APIRouter, status

from app.api.deps import SessionDep, errors, get_or_404
from app.schemas import ErrataOrder, ErratumCreate, ErratumOut, ErratumPatch
from app.services import notebooks as actions
from data.models import Erratum, Notebook
from vocabulary import ERRATUM

router = APIRouter(tags=["errata"])


@router.post(
    "/notebooks/{notebook_id}/errata",
    response_model=ErratumOut,
    status_code=status.HTTP_201_CREATED,
    responses=errors(404),
)
def create_erratum(notebook_id: int, body: ErratumCreate, session: SessionDep) -> Erratum:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    return actions.add_custom_erratum(session, notebook, body.text)


@router.get("/notebooks/{notebook_id}/errata", response_model=list[ErratumOut], responses=errors(404))
def list_errata(notebook_id: int, session: SessionDep) -> list[Erratum]:
    return get_or_404(session, Notebook, notebook_id, "notebook").errata


@router.post("/notebooks/{notebook_id}/errata/order", response_model=list[ErratumOut], responses=errors(404))
def order_errata(notebook_id: int, body: ErrataOrder, session: SessionDep) -> list[Erratum]:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    actions.reorder_errata(notebook, body.ids)
    session.refresh(notebook, ["errata"])
    return notebook.errata


@router.patch("/errata/{erratum_id}", response_model=ErratumOut, responses=errors(404))
def patch_erratum(erratum_id: int, body: ErratumPatch, session: SessionDep) -> Erratum:
    """Edit the text; a generated erratum edited by hand becomes `custom` (no longer re-rendered)."""
    erratum = get_or_404(session, Erratum, erratum_id, ERRATUM)
    actions.set_erratum_text(erratum, body.text)
    return erratum


@router.delete("/errata/{erratum_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
def delete_erratum(erratum_id: int, session: SessionDep) -> None:
    actions.delete_erratum(session, get_or_404(session, Erratum, erratum_id, ERRATUM))
