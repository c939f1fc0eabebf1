"""A notebook and what hangs on it: creating it, its document, its question, its fields (span
checks, limits, and the generated erratum that follows each field), its errata and its skill
placements. Raises `Unprocessable`; routes and pages turn it into a 422 naming the field.

Each public action commits (`app.services.unit.action`); `touch`, the checks and `find_span` do not."""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.services.errors import Gone, Unprocessable
from app.services.locks import hold, lost_race, touch_first
from app.services.unit import action, saving
from data.accounts import LOCAL_USER
from data.models import RUN_ACTIVE, Erratum, Field, Notebook, Placement, Question, Run, Skill, utcnow
from data.queue import revoke
from data.settings import get_settings
from vocabulary import render_erratum

log = logging.getLogger(__name__)


def touch(notebook: Notebook) -> None:
    notebook.updated_at = utcnow()


def check_served(model: str, field: str = "model") -> None:
    """Refuse a model that no worker of this installation serves (not in `KVNOTES_MODELS`): its runs
    would wait in the queue forever."""
    served = get_settings().models
    if model not in served:
        raise Unprocessable(field, f"model {model!r} is not served here; choose one of {', '.join(served)} "
                                   "(KVNOTES_MODELS)")


@action
def create_notebook(session: Session, title: str, model: str, document: str,
                    created_by: str = LOCAL_USER) -> Notebook:
    """A new notebook (committed, or flushed inside an outer `saving`). Raises `Unprocessable` for a
    model that is not served."""
    check_served(model)
    notebook = Notebook(title=title, model=model, document=document, created_by=created_by)
    session.add(notebook)
    session.flush()
    return notebook


@action
def change_model(notebook: Notebook, model: str) -> None:
    """Run the notebook on another served model; every skill placed in it must be for that model."""
    hold(notebook)
    check_served(model)
    for placement in notebook.placements:
        if placement.skill.model != model:
            skill = placement.skill
            raise Unprocessable("model", f"skill {skill.name!r} placed in this notebook is for "
                                         f"{skill.model}: remove it before changing the model to {model}")
    notebook.model = model
    touch(notebook)


@action
def rename_notebook(notebook: Notebook, title: str) -> None:
    """A new title (already validated by `NotebookPatch` / the form: not blank, within the limit)."""
    hold(notebook)
    notebook.title = title
    touch(notebook)


@action
def update_notebook(session: Session, notebook: Notebook, text: str | None = None, title: str | None = None,
                    model: str | None = None) -> None:
    """The API's PATCH: a new document, title or model (each optional), all or nothing."""
    hold(notebook)
    if text is not None:
        change_document(session, notebook, text)
    if title is not None:
        rename_notebook(notebook, title)
    if model is not None:
        change_model(notebook, model)
    touch(notebook)


@action
def duplicate_notebook(session: Session, notebook: Notebook, title: str | None = None,
                       created_by: str = LOCAL_USER) -> Notebook:
    """A new notebook with the same document, fields, errata (in order, each generated erratum
    still tied to its copied field), skill placements and current question; no runs (the copy's
    history starts empty)."""
    limit = get_settings().max_title_chars
    copy = create_notebook(session, (title or f"Copy of {notebook.title}")[:limit], notebook.model,
                           notebook.document, created_by)
    new_field: dict[int, Field] = {}
    for f in notebook.fields:
        new_field[f.id] = Field(start=f.start, end=f.end, old_value=f.old_value, new_value=f.new_value,
                                label=f.label)
        copy.fields.append(new_field[f.id])
    session.flush()
    for e in notebook.errata:
        linked = new_field.get(e.field_id) if e.field_id is not None else None
        copy.errata.append(Erratum(field_id=linked.id if linked else None, text=e.text, source=e.source,
                                   position=e.position))
    for p in notebook.placements:
        copy.placements.append(Placement(skill_id=p.skill_id, position=p.position))
    if notebook.question is not None:
        q = notebook.question
        copy.questions.append(Question(text=q.text, choices=list(q.choices), cot=q.cot))
    session.flush()
    return copy


def find_span(document: str, text: str, occurrence: int = 1) -> tuple[int, int]:
    """[start, end) of the `occurrence`-th (1 = first) appearance of `text` in `document`, for
    making a field without a mouse. Raises `Unprocessable` naming what was not found."""
    if not text:
        raise Unprocessable("find", "type the text to make a field of")
    if occurrence < 1:
        raise Unprocessable("occurrence", f"occurrence counts from 1 (the first); got {occurrence}")
    at, seen = -1, 0
    while seen < occurrence:
        at = document.find(text, at + 1)
        if at < 0:
            break
        seen += 1
    if at < 0:
        if seen == 0:
            raise Unprocessable("find",
                                f"{text[:60]!r} is not in the document (the search is case-sensitive)")
        raise Unprocessable("occurrence", f"{text[:60]!r} occurs {seen} time{'s' if seen != 1 else ''}; "
                                          f"there is no occurrence {occurrence}")
    return at, at + len(text)


DELETE_TRIES = 3  # a notebook's DELETE that loses a deadlock or a serialization conflict is tried again


def delete_notebook(session: Session, notebook: Notebook) -> None:
    """Delete the notebook with everything on it, its runs included (a deleted document must not
    stay readable in their snapshots); commits, then asks workers to drop its unfinished runs.
    The notebook's row is locked first (FOR UPDATE on PostgreSQL; the first write on SQLite), then
    the database cascades to its parts: the lock order every change of a part keeps (`hold`). A
    delete that still loses a race (a writer outside that order: "deadlock detected") is rolled back
    and tried again, up to `DELETE_TRIES` times, never left standing."""
    ident = notebook.id
    for attempt in range(1, DELETE_TRIES + 1):
        try:
            with saving(session):
                if session.get_bind().dialect.name == "postgresql":
                    locked = select(Notebook.id).where(Notebook.id == ident).with_for_update()
                    if session.scalar(locked) is None:
                        raise Gone(f"notebook {ident} was deleted")
                touch_first(session, ident, f"notebook {ident}")
                unfinished = select(Run.task_id).where(Run.notebook_id == ident, Run.status.in_(RUN_ACTIVE))
                task_ids = [t for t in session.scalars(unfinished) if t]
                session.delete(notebook)
            break
        except OperationalError as exc:
            if attempt == DELETE_TRIES or not lost_race(exc):
                raise
            log.warning("notebook delete lost a race; trying again",
                        extra={"notebook": ident, "attempt": attempt, "reason": type(exc.orig).__name__})
    for task_id in task_ids:
        revoke(task_id)


def new_question(notebook: Notebook, text: str, choices: list[str], cot: bool) -> Question:
    """The notebook's question from now on (earlier ones stay: runs refer to what they asked), not
    committed: a run started with it commits both, or neither (`app.services.runs.start_run`)."""
    question = Question(text=text, choices=list(choices), cot=cot)
    notebook.questions.append(question)
    touch(notebook)
    return question


@action
def set_question(notebook: Notebook, text: str, choices: list[str], cot: bool) -> Question:
    """The notebook's question from now on, saved."""
    hold(notebook)
    return new_question(notebook, text, choices, cot)


def check_span(notebook: Notebook, start: int, end: int, ignore: Field | None = None) -> None:
    """0 ≤ start < end ≤ len(document), and no overlap with another field of the notebook."""
    length = len(notebook.document)
    if not 0 <= start < end:
        raise Unprocessable("start", f"a field needs 0 <= start < end; got start={start}, end={end}")
    if end > length:
        raise Unprocessable("end", f"end={end} is past the end of the document ({length} characters)")
    for other in notebook.fields:
        if other is not ignore and start < other.end and other.start < end:
            raise Unprocessable(
                "start", f"[{start}, {end}) overlaps field {other.id} at [{other.start}, {other.end})"
            )


def next_erratum_position(session: Session, notebook: Notebook) -> int:
    last = session.scalar(select(func.max(Erratum.position)).where(Erratum.notebook_id == notebook.id))
    return 0 if last is None else last + 1


def check_errata_room(notebook: Notebook) -> None:
    limit = get_settings().max_errata
    if len(notebook.errata) >= limit:
        raise Unprocessable("text", f"a notebook holds at most {limit} errata")


@action
def add_field(
    session: Session, notebook: Notebook, start: int, end: int, new_value: str, label: str
) -> Field:
    """A new field on `notebook[start:end]` and its generated erratum."""
    hold(notebook)
    limit = get_settings().max_fields
    if len(notebook.fields) >= limit:
        raise Unprocessable("start", f"a notebook holds at most {limit} fields")
    check_span(notebook, start, end)
    check_errata_room(notebook)
    field = Field(
        start=start, end=end, old_value=notebook.document[start:end], new_value=new_value, label=label
    )
    notebook.fields.append(field)
    session.flush()
    notebook.errata.append(
        Erratum(
            field_id=field.id,
            text=render_erratum(label, field.old_value, new_value),
            source="generated",
            position=next_erratum_position(session, notebook),
        )
    )
    touch(notebook)
    return field


def generated_errata(session: Session, field: Field) -> list[Erratum]:
    query = select(Erratum).where(Erratum.field_id == field.id, Erratum.source == "generated")
    return list(session.scalars(query))


def refresh_field(session: Session, field: Field) -> None:
    """Re-read the old value from the document and re-render the field's generated errata (an
    erratum edited by hand is `custom` and left alone)."""
    field.old_value = field.notebook.document[field.start : field.end]
    for erratum in generated_errata(session, field):
        erratum.text = render_erratum(field.label, field.old_value, field.new_value)


@action
def update_field(session: Session, field: Field, changes: dict[str, object]) -> None:
    hold(field)
    start = int(changes.get("start", field.start))  # type: ignore[arg-type]
    end = int(changes.get("end", field.end))  # type: ignore[arg-type]
    check_span(field.notebook, start, end, ignore=field)
    for name, value in changes.items():
        setattr(field, name, value)
    refresh_field(session, field)
    touch(field.notebook)


@action
def delete_field(session: Session, field: Field) -> None:
    """Drop the field and its generated errata; hand-written errata stay (unlinked)."""
    hold(field)
    for erratum in generated_errata(session, field):
        session.delete(erratum)
    session.delete(field)


@action
def change_document(session: Session, notebook: Notebook, text: str) -> None:
    """Replace the document; every field and placement must still fit in the new text."""
    hold(notebook)
    for field in notebook.fields:
        if field.end > len(text):
            raise Unprocessable(
                "text",
                f"field {field.id} spans [{field.start}, {field.end}), past the new text's end ({len(text)})",
            )
    for placement in notebook.placements:
        if placement.position is not None and placement.position > len(text):
            raise Unprocessable(
                "text",
                f"placement {placement.id} sits at {placement.position}, "
                f"past the new text's end ({len(text)})",
            )
    notebook.document = text
    for field in notebook.fields:
        refresh_field(session, field)


@action
def reorder_errata(notebook: Notebook, ids: list[int]) -> None:
    """Give the notebook's errata the order of `ids`, which must name each of them exactly once."""
    hold(notebook)
    have = {erratum.id: erratum for erratum in notebook.errata}
    if sorted(ids) != sorted(have):
        raise Unprocessable("ids", f"ids must list this notebook's errata exactly once each: {sorted(have)}")
    for position, ident in enumerate(ids):
        have[ident].position = position
    touch(notebook)


def check_position(notebook: Notebook, position: int | None) -> None:
    if position is not None and position > len(notebook.document):
        raise Unprocessable(
            "position",
            f"position={position} is past the end of the document ({len(notebook.document)} characters)",
        )


@action
def add_custom_erratum(session: Session, notebook: Notebook, text: str) -> Erratum:
    """Append a hand-written erratum after the others."""
    hold(notebook)
    check_errata_room(notebook)
    erratum = Erratum(text=text, source="custom", position=next_erratum_position(session, notebook))
    notebook.errata.append(erratum)
    touch(notebook)
    return erratum


@action
def delete_erratum(session: Session, erratum: Erratum) -> None:
    hold(erratum)
    session.delete(erratum)


@action
def set_erratum_text(erratum: Erratum, text: str) -> None:
    """New text; a generated erratum edited by hand becomes `custom` (no longer re-rendered)."""
    hold(erratum)
    if text != erratum.text:
        erratum.text, erratum.source = text, "custom"
        touch(erratum.notebook)


@action
def add_placement(notebook: Notebook, skill: Skill, position: int | None,
                  compiling_ok: bool = False) -> Placement:
    """Splice `skill` at a character offset of the document (None: at the end). The skill must be
    for the notebook's model and compiled (an example loading its own skills may place them while
    they compile: `compiling_ok`)."""
    hold(notebook)
    limit = get_settings().max_placements
    if len(notebook.placements) >= limit:
        raise Unprocessable("skill_id", f"a notebook holds at most {limit} placements")
    if skill.model != notebook.model:
        raise Unprocessable("skill_id",
                            f"skill {skill.name!r} is for {skill.model}, this notebook runs {notebook.model}")
    if skill.status != "compiled" and not (compiling_ok and skill.status == "compiling"):
        raise Unprocessable("skill_id", f"skill {skill.name!r} is not compiled for {notebook.model}")
    check_position(notebook, position)
    placement = Placement(skill=skill, position=position)
    notebook.placements.append(placement)
    touch(notebook)
    return placement


@action
def move_placement(placement: Placement, position: int | None) -> None:
    """Splice the skill at another character offset (None: at the end)."""
    hold(placement)
    check_position(placement.notebook, position)
    placement.position = position
    touch(placement.notebook)


@action
def delete_placement(session: Session, placement: Placement) -> None:
    hold(placement)
    session.delete(placement)


def load_for_page(notebook: Notebook) -> Notebook:
    """Load now everything a page of the notebook shows (its fields, errata, placements with their
    skills, questions), so that rendering it queries nothing (`app.web.templating`'s guard)."""
    for placement in notebook.placements:
        _ = placement.skill.name
    _ = (notebook.fields, notebook.errata, notebook.questions)
    return notebook
