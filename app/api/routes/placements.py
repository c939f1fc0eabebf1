"""Placements: a skill spliced into a notebook at a character offset (null: after the document)."""

from __future__ import annotations

from fastapi import APIRouter, status

from app.api.deps import SessionDep, errors, get_or_404
from app.schemas import PlacementCreate, PlacementOut, PlacementPatch
from app.services import notebooks as actions
from app.services.errors import Unprocessable
from data.models import Notebook, Placement, Skill

router = APIRouter(tags=["placements"])


@router.post(
    "/notebooks/{notebook_id}/placements",
    response_model=PlacementOut,
    status_code=status.HTTP_201_CREATED,
    responses=errors(404),
)
def create_placement(notebook_id: int, body: PlacementCreate, session: SessionDep) -> Placement:
    notebook = get_or_404(session, Notebook, notebook_id, "notebook")
    skill = session.get(Skill, body.skill_id)
    if skill is None:  # a name in the body, not the address: the request is wrong, not the resource gone
        raise Unprocessable("skill_id", f"skill {body.skill_id} does not exist")
    return actions.add_placement(notebook, skill, body.position)


@router.get("/notebooks/{notebook_id}/placements", response_model=list[PlacementOut], responses=errors(404))
def list_placements(notebook_id: int, session: SessionDep) -> list[Placement]:
    return get_or_404(session, Notebook, notebook_id, "notebook").placements


@router.get("/placements/{placement_id}", response_model=PlacementOut, responses=errors(404))
def read_placement(placement_id: int, session: SessionDep) -> Placement:
    return get_or_404(session, Placement, placement_id, "placement")


@router.patch("/placements/{placement_id}", response_model=PlacementOut, responses=errors(404))
def move_placement(placement_id: int, body: PlacementPatch, session: SessionDep) -> Placement:
    placement = get_or_404(session, Placement, placement_id, "placement")
    actions.move_placement(placement, body.position)
    return placement


@router.delete("/placements/{placement_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
def delete_placement(placement_id: int, session: SessionDep) -> None:
    actions.delete_placement(session, get_or_404(session, Placement, placement_id, "placement"))
