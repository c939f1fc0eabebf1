"""The skills library: write a skill, compile it (a worker job whose progress polls like a run's),
see its size in tokens and its compile time, remove it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select

from app.api.deps import SessionDep, get_or_404
from app.schemas import SkillCreate
from app.web.forms import FormErrors, normalize_newlines, validate
from app.web.templating import render
from data.models import Skill
from data.queue import QueueUnavailable, enqueue_compile
from data.settings import get_settings

router = APIRouter()


def _skills_page(request: Request, session: SessionDep, status: int = 200, **extra) -> Response:
    skills = list(session.scalars(select(Skill).order_by(Skill.updated_at.desc(), Skill.id.desc())))
    context = {"skills": skills, "models": get_settings().models, "values": {}, "errors": {}, "nav": "skills"}
    context.update(extra)
    return render(request, "skills.html", status, **context)


@router.get("/skills")
def skills_page(request: Request, session: SessionDep) -> Response:
    return _skills_page(request, session)


def _compile(session: SessionDep, skill: Skill) -> str | None:
    """Same steps as POST /api/skills/{id}/compile; returns why it could not be queued, or None."""
    skill.status, skill.progress, skill.error = "compiling", 0.0, None
    session.flush()
    try:
        skill.task_id = enqueue_compile(skill)
    except QueueUnavailable as exc:
        skill.status, skill.error = "failed", f"could not queue the compile job: {exc.reason}"
        return exc.reason
    return None


@router.post("/skills")
def create_skill(
    request: Request, session: SessionDep,
    name: Annotated[str, Form()] = "", text: Annotated[str, Form()] = "", model: Annotated[str, Form()] = "",
    compile: Annotated[str | None, Form()] = None,
) -> Response:
    text = normalize_newlines(text)
    values = {"name": name, "text": text, "model": model}
    try:
        if model not in get_settings().models:
            raise FormErrors({"model": f"choose one of: {', '.join(get_settings().models)}"})
        body = validate(SkillCreate, {"name": name.strip(), "text": text, "model": model})
    except FormErrors as exc:
        return _skills_page(request, session, 422, values=values, errors=exc.errors)
    skill = Skill(name=body.name, text=body.text, model=body.model, status="draft", progress=0.0)
    session.add(skill)
    session.flush()
    if compile:
        _compile(session, skill)
    session.commit()
    return RedirectResponse("/skills", status_code=303)


@router.post("/skills/{skill_id}/compile")
def compile_skill(request: Request, skill_id: int, session: SessionDep) -> Response:
    skill = get_or_404(session, Skill, skill_id, "skill")
    if skill.status != "compiling":
        _compile(session, skill)
        session.commit()
    return render(request, "_skill_row.html", s=skill)


@router.get("/skills/{skill_id}/row")
def skill_row(request: Request, skill_id: int, session: SessionDep) -> Response:
    """The skill's row; polls every second while it compiles, and stops (no trigger) after."""
    return render(request, "_skill_row.html", s=get_or_404(session, Skill, skill_id, "skill"))


@router.post("/skills/{skill_id}/delete")
def delete_skill(request: Request, skill_id: int, session: SessionDep) -> Response:
    session.delete(get_or_404(session, Skill, skill_id, "skill"))
    session.commit()
    if request.headers.get("HX-Request") == "true":
        return Response("")
    return RedirectResponse("/skills", status_code=303)
