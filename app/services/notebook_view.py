"""A notebook's one view: `NotebookOut`, the JSON API's shape (its document as `text`, its fields,
errata in order, skill placements and current question), built here from the database and nowhere
else. The notebook page renders the same rows after `notebooks.load_for_page` has loaded them."""

from __future__ import annotations

from app.schemas import ErratumOut, FieldOut, NotebookOut, PlacementOut, QuestionOut
from app.services.notebooks import load_for_page
from data.models import Notebook


def notebook_view(notebook: Notebook) -> NotebookOut:
    """The notebook and everything on it, loaded first, then read once into the view."""
    load_for_page(notebook)
    question = notebook.question
    return NotebookOut(
        id=notebook.id, title=notebook.title, model=notebook.model, created_by=notebook.created_by,
        created_at=notebook.created_at, updated_at=notebook.updated_at, text=notebook.document,
        fields=[FieldOut.model_validate(f) for f in notebook.fields],
        errata=[ErratumOut.model_validate(e) for e in notebook.errata],
        placements=[PlacementOut.model_validate(p) for p in notebook.placements],
        question=QuestionOut.model_validate(question) if question is not None else None,
        policy_strategy=notebook.policy_strategy, policy_sweep_id=notebook.policy_sweep_id,
        policy_threshold=notebook.policy_threshold, policy_sentence=notebook.policy_sentence,
        policy_fields=list(notebook.policy_fields) if notebook.policy_fields else None,
    )
