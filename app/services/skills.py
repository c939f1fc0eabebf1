"""Skills: texts compiled once into notes by a worker, then spliced into any notebook.

Compiling has one failure policy wherever it is asked for (the API, the skills page, an example):
if the broker cannot take the message, `QueueUnavailable` propagates, the skill keeps the state it
had, and the caller saves nothing of the request (503 with the reason).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.services.unit import action
from data.accounts import LOCAL_USER
from data.models import Skill
from data.queue import QueueUnavailable, enqueue_compile


class AlreadyCompiling(RuntimeError):
    """A compile was asked for a skill a worker is compiling now."""


@action
def create_skill(session: Session, name: str, text: str, model: str, created_by: str = LOCAL_USER) -> Skill:
    """A new draft skill (committed, or flushed inside an outer `saving`)."""
    skill = Skill(name=name, text=text, model=model, status="draft", progress=0.0, created_by=created_by)
    session.add(skill)
    session.flush()
    return skill


@action
def change_skill(skill: Skill, name: str | None = None, text: str | None = None,
                 model: str | None = None) -> None:
    """Renaming keeps the compiled notes; a new text or model makes the skill a draft again."""
    if name is not None:
        skill.name = name
    if (text is not None and text != skill.text) or (model is not None and model != skill.model):
        skill.text = text if text is not None else skill.text
        skill.model = model if model is not None else skill.model
        skill.status, skill.progress, skill.store_key, skill.token_count = "draft", 0.0, None, None
        skill.compile_ms, skill.error = None, None


@action
def request_compile(session: Session, skill: Skill) -> None:
    """Send the skill to its model's worker; it is `compiling` until the worker reports.

    Raises `AlreadyCompiling`, or `QueueUnavailable` with the skill left as it was (rolled back)."""
    if skill.status == "compiling":
        raise AlreadyCompiling(f"skill {skill.id} is already compiling")
    before = (skill.status, skill.progress, skill.error)
    skill.status, skill.progress, skill.error = "compiling", 0.0, None
    session.flush()
    try:
        skill.task_id = enqueue_compile(skill)
    except QueueUnavailable:
        skill.status, skill.progress, skill.error = before
        session.flush()
        raise


@action
def delete_skill(session: Session, skill: Skill) -> None:
    """The skill goes, with its placements in every notebook; runs keep their snapshots."""
    session.delete(skill)
