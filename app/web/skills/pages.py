"""The skills library: write a skill, compile it (a worker job whose progress polls like a run's),
see its size in tokens and its compile time, remove it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.schemas import SkillCreate
from app.services import skills as actions
from app.services.errors import Unprocessable
from app.services.unit import saving
from app.web.forms import validate
from app.web.paging import page_param, paginate
from app.web.templating import render
from data.models import Skill
from data.queue import QueueUnavailable
from data.settings import get_settings

router = APIRouter()


SKILLS_PER_PAGE = 50


def _skills_page(request: Request, session: SessionDep, status: int = 200, page: int = 1,
                 **extra) -> Response:
    query = select(Skill).order_by(Skill.updated_at.desc(), Skill.id.desc())
    pager, skills = paginate(session, query, page, SKILLS_PER_PAGE, "/skills")
    context = {"skills": skills, "page": pager, "models": get_settings().models, "values": {}, "errors": {},
               "nav": "skills"}
    context.update(extra)
    return render(request, "skills.html", status, **context)


@router.get("/skills")
def skills_page(request: Request, session: SessionDep, page: int = page_param()) -> Response:
    return _skills_page(request, session, page=page)


@router.post("/skills")
def create_skill(
    request: Request, session: SessionDep, principal: PrincipalDep,
    name: Annotated[str, Form()] = "", text: Annotated[str, Form()] = "", model: Annotated[str, Form()] = "",
    compile: Annotated[str | None, Form()] = None,
) -> Response:
    """Save the skill (and send it to compile when asked). If the compile cannot be queued, nothing
    is saved and the form comes back with what was typed and the reason (503)."""
    values = {"name": name, "text": text, "model": model}
    try:
        if model not in get_settings().models:
            raise Unprocessable("model", f"choose one of: {', '.join(get_settings().models)}")
        body = validate(SkillCreate, {"name": name.strip(), "text": text, "model": model})
        with saving(session):  # with its compile request, or not at all
            skill = actions.create_skill(session, body.name, body.text, body.model, principal.name)
            if compile:
                actions.request_compile(session, skill)
    except Unprocessable as exc:
        return _skills_page(request, session, 422, values=values, errors=exc.errors)
    except QueueUnavailable as exc:  # rolled back
        message = f"The compile could not be queued, nothing was saved: {exc.reason}"
        return _skills_page(request, session, 503, values=values, errors={"form": message})
    return RedirectResponse("/skills", status_code=303)


@router.post("/skills/{skill_id}/compile")
def compile_skill(request: Request, skill_id: int, session: SessionDep) -> Response:
    """The skill's row, compiling; or, if the compile cannot be queued, unchanged with the reason."""
    skill = get_or_404(session, Skill, skill_id, "skill")
    try:
        actions.request_compile(session, skill)
    except actions.AlreadyCompiling:
        pass  # the row already polls its progress
    except QueueUnavailable as exc:  # rolled back: the skill is as it was
        return render(request, "_skill_row.html", 503, s=skill, queue_error=exc.reason)
    return render(request, "_skill_row.html", s=skill)


@router.get("/skills/{skill_id}/row")
def skill_row(request: Request, skill_id: int, session: SessionDep) -> Response:
    """The skill's row; polls every second while it compiles, and stops (no trigger) after."""
    return render(request, "_skill_row.html", s=get_or_404(session, Skill, skill_id, "skill"))


@router.post("/skills/{skill_id}/delete")
def delete_skill(request: Request, skill_id: int, session: SessionDep) -> Response:
    actions.delete_skill(session, get_or_404(session, Skill, skill_id, "skill"))
    if request.headers.get("HX-Request") == "true":
        return Response("")
    return RedirectResponse("/skills", status_code=303)
