"""Skills: texts compiled once into notes and spliced into notebooks; compiling is a worker task."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import SkillCreate, SkillOut, SkillPatch
from app.services import skills as actions
from data.models import Skill
from data.queue import QueueUnavailable

router = APIRouter(tags=["skills"])


@router.post("/skills", response_model=SkillOut, status_code=status.HTTP_201_CREATED)
def create_skill(body: SkillCreate, session: SessionDep, principal: PrincipalDep) -> Skill:
    return actions.create_skill(session, body.name, body.text, body.model, principal.name)


@router.get("/skills", response_model=list[SkillOut])
def list_skills(session: SessionDep) -> list[Skill]:
    return list(session.scalars(select(Skill).order_by(Skill.name, Skill.id)))


@router.get("/skills/{skill_id}", response_model=SkillOut, responses=errors(404))
def read_skill(skill_id: int, session: SessionDep) -> Skill:
    return get_or_404(session, Skill, skill_id, "skill")


@router.patch("/skills/{skill_id}", response_model=SkillOut, responses=errors(404))
def patch_skill(skill_id: int, body: SkillPatch, session: SessionDep) -> Skill:
    """Renaming keeps the compiled notes; a new text or model makes the skill a draft again."""
    skill = get_or_404(session, Skill, skill_id, "skill")
    actions.change_skill(skill, body.name, body.text, body.model)
    return skill


@router.delete("/skills/{skill_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
def delete_skill(skill_id: int, session: SessionDep) -> None:
    """Deletes the skill and its placements in every notebook (runs keep their snapshot)."""
    actions.delete_skill(session, get_or_404(session, Skill, skill_id, "skill"))


@router.post(
    "/skills/{skill_id}/compile",
    response_model=SkillOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses=errors(404, 409, 503),
)
def compile_skill(skill_id: int, session: SessionDep) -> Skill:
    """Enqueue `kvnotes.compile_skill`; the skill is `compiling` until the worker reports."""
    skill = get_or_404(session, Skill, skill_id, "skill")
    try:
        actions.request_compile(session, skill)
    except actions.AlreadyCompiling as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    except QueueUnavailable as exc:  # rolled back: the skill is as it was
        raise HTTPException(status_code=503, detail=exc.reason) from exc
    return skill
