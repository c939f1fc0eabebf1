"""Bundled example notebooks: JSON files under `examples/` turned into a notebook with its fields,
question, skills and placements, through the same services as everything else.

Format: {title, model?, description?, document, fields: [{find, new_value, label}], question,
choices?, cot?, skills?: [{name, text, position_find | null}]}. `find` and `position_find` are
matched against the document (first occurrence); a missing one is an error naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.services.notebooks import add_field, add_placement, create_notebook, set_question
from app.services.skills import create_skill, request_compile
from app.web.templating import EXAMPLES_DIR
from data.accounts import LOCAL_USER
from data.models import Notebook, Skill
from data.settings import get_settings


class ExampleError(ValueError):
    """An example file that cannot be loaded; the message names the file and the key."""


@dataclass(frozen=True)
class Example:
    slug: str
    title: str
    description: str
    path: Path


def list_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "document" in data:
            out.append(Example(path.stem, str(data.get("title", path.stem)), str(data.get("description", "")), path))
    return out


def _find(document: str, needle: str, what: str, slug: str) -> int:
    at = document.find(needle)
    if not needle or at < 0:
        raise ExampleError(f"example {slug}: {what} {needle!r} is not in the document")
    return at


def _skill(session: Session, name: str, text: str, model: str, created_by: str) -> Skill:
    """The library's skill with this name, text and model, or a new one sent to compile (raises
    `QueueUnavailable` when the broker cannot take it: the caller saves nothing)."""
    found = session.scalar(select(Skill).where(Skill.name == name, Skill.text == text, Skill.model == model))
    if found is not None:
        return found
    skill = create_skill(session, name, text, model, created_by)
    request_compile(session, skill)
    return skill


def opened_examples(session: Session, slugs: list[str]) -> dict[str, Notebook]:
    """For each example already loaded, the newest notebook made from it (one grouped query on
    the `example` index, then those few rows)."""
    if not slugs:
        return {}
    newest = select(func.max(Notebook.id)).where(Notebook.example.in_(slugs)).group_by(Notebook.example)
    return {nb.example or "": nb for nb in session.scalars(select(Notebook).where(Notebook.id.in_(newest)))}


def load_example(session: Session, slug: str, directory: Path = EXAMPLES_DIR, created_by: str = LOCAL_USER) -> Notebook:
    """Create the notebook of `examples/<slug>.json` (committed by the caller)."""
    path = directory / f"{slug}.json"
    if not path.is_file() or path.parent != directory:
        raise ExampleError(f"no example named {slug!r}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    document = str(data["document"])
    model = str(data.get("model") or get_settings().default_model)
    notebook = create_notebook(session, str(data.get("title", slug)), model, document, created_by)
    notebook.example = slug
    for f in data.get("fields", []):
        start = _find(document, f["find"], "field", slug)
        add_field(session, notebook, start, start + len(f["find"]), str(f["new_value"]), str(f.get("label", "")))
    if data.get("question"):
        set_question(notebook, str(data["question"]), list(data.get("choices") or []), bool(data.get("cot")))
    for s in data.get("skills", []):
        anchor = s.get("position_find")
        position = None if anchor is None else _find(document, anchor, "skill position", slug)
        skill = _skill(session, s["name"], s["text"], model, created_by)
        add_placement(notebook, skill, position, compiling_ok=True)  # it compiles while the notebook opens
    return notebook
