"""A real finished run for the page tests: the notebook's run started as the app starts it, then
run by the real `kvnotes.run` task in this process (the engine on a tiny random model, the mapping,
the final write): every token record, attention map and notes map is the engine's own."""

from __future__ import annotations

from data.models import Field, Notebook, Placement, Question, Skill
from tests.web.conftest import session

MODEL = "tiny-llama"  # byte tokens: each token's text is one character of what the notes hold


def engine_notebook(document: str, fields: list[tuple[str, str, str]], question: str = "What is the status?",
                    skill: tuple[str, int] | None = None, title: str = "Engine") -> int:
    """A notebook on the tiny model with `fields` as (old text, new value, label) (each old text's
    first occurrence), a free question and, with `skill` = (text, document character), a placed skill."""
    with session() as s:
        nb = Notebook(title=title, model=MODEL, document=document)
        for old, new, label in fields:
            at = document.index(old)
            nb.fields.append(Field(start=at, end=at + len(old), old_value=old, new_value=new, label=label))
        nb.questions.append(Question(text=question, choices=[], cot=False))
        if skill is not None:
            made = Skill(name="house rules", text=skill[0], model=MODEL)
            s.add(made)
            s.flush()
            nb.placements.append(Placement(skill_id=made.id, position=skill[1]))
        s.add(nb)
        s.commit()
        return nb.id


def engine_run(notebook_id: int, strategies: list[str], attribution: bool = False) -> int:
    """Run the notebook's question through the real run task (in this process); the run's id."""
    from app.services.runs import start_run
    from worker.tasks import run as run_task

    with session() as s:
        nb = s.get(Notebook, notebook_id)
        run = start_run(s, nb, nb.question, strategies, attribution=attribution)
        run_id, token = run.id, run.task_id
    outcome = run_task.apply(args=(run_id,), task_id=token).get()  # the message's own token
    assert outcome["status"] == "succeeded", outcome
    return run_id
