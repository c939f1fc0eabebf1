"""Bundled example notebooks: JSON files under `examples/` turned into a notebook with its fields,
question, skills and placements, through the same services as everything else.

Format: {title, model?, summary?, description?, document, fields: [{find, new_value, label}], question,
choices?, cot?, skills?: [{name, text, position_find | null}]}. `find` and `position_find` are
matched against the document (first occurrence); a missing one is an error naming it.

An example states no number by hand: its description names measured values as `{strategy.key}`
(`answer`, `answer_f1`, `kl`, `same_decision`, `edit_followed`, or `first_line`: the answer's first
line, for a base model that goes on past its answer with more questions of its own), filled from
`examples/<slug>.measured.json`, which `scripts/measure_examples.py` writes by running the example
on every bundled model (and `tests/web/test_examples.py` runs again to check). That file also names
the model the example runs on, the one that reads its field back, with the sentence that says why
(`chosen_model`); the example's card and notebook page show that sentence.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
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
from vocabulary import FLOOR, REFERENCE
from vocabulary.readback import Reading, choose_model

log = logging.getLogger(__name__)
MEASURED_SUFFIX = ".measured.json"
MEASURED_KEYS = ("answer", "answer_f1", "kl", "same_decision", "edit_followed")
FIRST_LINE = "first_line"  # a citation of the answer's first line (derived from `answer`)
_CITED = re.compile(r"\{(\w+)\.(\w+)\}")


class ExampleError(ValueError):
    """An example file that cannot be loaded; the message names the file and the key."""


@dataclass(frozen=True)
class SpecField:
    start: int
    end: int
    new_value: str
    label: str


@dataclass(frozen=True)
class SpecSkill:
    name: str
    text: str
    position: int | None  # a character offset in the document; None: at the end


@dataclass(frozen=True)
class ExampleSpec:
    """An example file, checked and resolved to character offsets (what a notebook, or the
    measuring script's engine request, is built from)."""

    slug: str
    title: str
    model: str
    description: str  # as written, `{strategy.key}` citations unfilled
    document: str
    fields: tuple[SpecField, ...]
    question: str
    choices: tuple[str, ...]
    cot: bool
    skills: tuple[SpecSkill, ...]
    summary: str = ""  # one plain sentence of what it shows, no numbers (the first page's line)


@dataclass(frozen=True)
class Example:
    slug: str
    title: str
    description: str  # with the measured values filled in
    path: Path
    measured_model: str = ""  # the model the numbers were measured on ("" when none are cited)
    summary: str = ""  # one plain sentence; the description's numbers sit behind a "details" toggle
    model_reason: str = ""  # which model it runs on and why, one sentence ("" when not measured)


def _find(document: str, needle: str, what: str, slug: str) -> int:
    at = document.find(needle)
    if not needle or at < 0:
        raise ExampleError(f"example {slug}: {what} {needle!r} is not in the document")
    return at


def read_spec(slug: str, directory: Path = EXAMPLES_DIR) -> ExampleSpec:
    """`examples/<slug>.json`, checked; an unknown slug or a missing key is an `ExampleError`."""
    path = directory / f"{slug}.json"
    if not path.is_file() or path.parent != directory or slug.endswith(MEASURED_SUFFIX[:-5]):
        raise ExampleError(f"no example named {slug!r}")
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        document = str(data["document"])
        fields = tuple(SpecField(at := _find(document, f["find"], "field", slug), at + len(f["find"]),
                                 str(f["new_value"] if "new_value" in f else f["values"][0]),  # sweep: 1st
                                 str(f.get("label", "")))
                       for f in data.get("fields", []))
        skills = tuple(SpecSkill(s["name"], s["text"], None if s.get("position_find") is None
                                 else _find(document, s["position_find"], "skill position", slug))
                       for s in data.get("skills", []))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ExampleError):
            raise
        raise ExampleError(f"example {slug}: {type(exc).__name__} {exc}") from None
    return ExampleSpec(slug, str(data.get("title", slug)),
                       str(data.get("model") or get_settings().default_model),
                       str(data.get("description", "")), document, fields, str(data.get("question") or ""),
                       tuple(str(c) for c in data.get("choices") or ()), bool(data.get("cot")), skills,
                       str(data.get("summary", "")))


def measured_path(slug: str, directory: Path = EXAMPLES_DIR) -> Path:
    return directory / f"{slug}{MEASURED_SUFFIX}"


def cited(description: str) -> list[tuple[str, str]]:
    """The (strategy, key) pairs a description cites, in order."""
    return _CITED.findall(description)


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}" if value == 0 or abs(value) >= 0.01 else f"{value:.2g}"  # KL 0.00038, not 0.00
    if isinstance(value, str):
        return f"“{value.strip()}”"
    return str(value)


def chosen_model(models: dict[str, dict]) -> tuple[str, str]:
    """The model an example runs on and why, from each model's stored run (`{model: {"strategies":
    {name: {answer, edit_followed, …}}}`, in preference order): the first whose recompute names the
    new value while its stale notes keep the old one (`vocabulary.readback.choose_model`)."""
    readings = []
    for model, run in models.items():
        rows = run["strategies"]
        readings.append(Reading(model, rows[REFERENCE]["answer"], rows[REFERENCE]["edit_followed"],
                                rows[FLOOR]["answer"], rows[FLOOR]["edit_followed"]))
    return choose_model(readings)


def filled(spec: ExampleSpec, directory: Path = EXAMPLES_DIR) -> tuple[str, str, str]:
    """The description with each `{strategy.key}` replaced by the stored measurement on the
    example's model, that model, and the sentence saying why it runs on it. A citation the
    measurement lacks, or a measurement that chose another model, is an `ExampleError` naming it."""
    if not cited(spec.description):
        return spec.description, "", ""
    path = measured_path(spec.slug, directory)
    try:
        measured = json.loads(path.read_text(encoding="utf-8"))
        runs = measured["models"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ExampleError(f"example {spec.slug}: {path.name} is missing or unreadable "
                           "(write it with scripts/measure_examples.py)") from None
    if measured.get("model") != spec.model or spec.model not in runs:
        raise ExampleError(f"example {spec.slug}: {path.name} chose {measured.get('model')!r} but "
                           f"{spec.slug}.json names {spec.model!r}")

    def one(m: re.Match) -> str:
        strategy, key = m.group(1), m.group(2)
        row = runs[spec.model].get("strategies", {}).get(strategy, {})
        if key == FIRST_LINE and "answer" in row:
            return _shown((row["answer"].strip().splitlines() or [""])[0])
        if key not in MEASURED_KEYS or key not in row:
            raise ExampleError(f"example {spec.slug}: {m.group(0)} is not in {path.name}")
        return _shown(row[key])

    return _CITED.sub(one, spec.description), spec.model, str(measured.get("reason", ""))


def example_slugs(directory: Path = EXAMPLES_DIR) -> list[str]:
    return [p.stem for p in sorted(directory.glob("*.json")) if not p.name.endswith(MEASURED_SUFFIX)]


def list_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Every example that loads, its description filled (one that does not is logged and left out);
    read again only when a file of the folder changes (the home page lists them on every visit)."""
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(directory.glob("*.json")))
    return list(_listed(directory, stamp))


@lru_cache(maxsize=8)
def _listed(directory: Path, stamp: tuple) -> tuple[Example, ...]:
    out = []
    for slug in example_slugs(directory):
        try:
            spec = read_spec(slug, directory)
            description, model, reason = filled(spec, directory)
        except ExampleError as exc:
            log.warning("example skipped", extra={"example": slug, "reason": str(exc)})
            continue
        out.append(Example(slug, spec.title, description, directory / f"{slug}.json", model, spec.summary,
                           reason))
    return tuple(out)


def example_named(slug: str | None, directory: Path = EXAMPLES_DIR) -> Example | None:
    """The bundled example `slug` (a notebook's `example`), or None when there is none by that name."""
    return next((ex for ex in list_examples(directory) if ex.slug == slug), None) if slug else None


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


def load_example(session: Session, slug: str, directory: Path = EXAMPLES_DIR,
                 created_by: str = LOCAL_USER) -> Notebook:
    """Create the notebook of `examples/<slug>.json` (committed by the caller)."""
    spec = read_spec(slug, directory)
    notebook = create_notebook(session, spec.title, spec.model, spec.document, created_by)
    notebook.example = slug
    for f in spec.fields:
        add_field(session, notebook, f.start, f.end, f.new_value, f.label)
    if spec.question:
        set_question(notebook, spec.question, list(spec.choices), spec.cot)
    for s in spec.skills:
        add_placement(notebook, _skill(session, s.name, s.text, spec.model, created_by), s.position,
                      compiling_ok=True)
    return notebook
