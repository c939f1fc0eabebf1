"""Sweeps: starting one (its edits checked, the sweep and one run per edit committed, then one
message per edit on the model's queue; if the broker refuses, the sweep and its runs are deleted
again, so nothing is saved) and cancelling one (edits already finished are kept and counted).

Each edit is an ordinary run (`runs.sweep_id`): the same snapshot a run of the notebook takes, with
only the edit's fields set to its values, so each opens as an ordinary run page. A sweep has a cap
of its own (`KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER`) instead of the run caps, and its edits are sent at
a lower priority than runs (`data.queue.SWEEP_PRIORITY`) so they queue behind other users' runs.
"""

from __future__ import annotations

import logging

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.services.errors import Unprocessable
from app.services.jobs import cancel, check_caps, enqueue_or_unsave
from app.services.notebooks import check_served
from app.services.sweep_input import PlannedEdits, SweepCreate, plan_edits
from app.services.sweep_view import build_sweep_view
from app.services.unit import action
from data.accounts import LOCAL_USER
from data.contracts import (
    FieldPolicy,
    RunSnapshot,
    SnapshotField,
    SnapshotPlacement,
    SnapshotQuestion,
    SweepEdit,
)
from data.jobs import SWEEPS
from data.models import Notebook, Run, RunStatus, Sweep
from data.queue import SWEEP_PRIORITY, enqueue_run
from data.sweep_edits import STOPPED_CANCELLED, cancel_edits

log = logging.getLogger(__name__)


def sweep_question(notebook: Notebook, body: SweepCreate) -> SnapshotQuestion:
    """The question the sweep asks: the request's, or the notebook's current one."""
    current = notebook.question
    if body.question is None and current is None:
        raise Unprocessable("question", "this notebook has no question yet; send one with the sweep")
    question_text = body.question if body.question is not None else current.text  # type: ignore[union-attr]
    if not question_text.strip():
        raise Unprocessable("question", "the question is empty: the decision is read after it")
    if body.choices is not None:
        choices = body.choices
    else:
        choices = list(current.choices) if current is not None and body.question is None else []
    if any(not c.strip() for c in choices):
        raise Unprocessable("choices", "a choice is empty")
    return SnapshotQuestion(text=question_text, choices=list(choices), cot=False)


def edit_snapshot(notebook: Notebook, question: SnapshotQuestion, strategies: list[str],
                  edit: SweepEdit, sweep_id: int, timed: bool = True,
                  user: str | None = None) -> RunSnapshot:
    """What the edit's run runs on: the notebook's document with only the edit's fields set to its
    values (errata rendered from them by the worker), its placements, the sweep's question; `timed`:
    whether the worker times it in paired rounds (the sweep's first `timed_edits`) or decides only."""
    fields = [SnapshotField(start=f.start, end=f.end, old=f.old_value, new=edit.values[f.label],
                            label=f.label)
              for f in sorted(notebook.fields, key=lambda f: f.start) if f.label in edit.values]
    return RunSnapshot(
        model=notebook.model, document=notebook.document, fields=fields, errata=[],
        placements=[SnapshotPlacement(skill_id=p.skill_id, name=p.skill.name, text=p.skill.text,
                                      position=p.position) for p in notebook.placements],
        question=question, strategies=list(strategies), sweep_id=sweep_id, timed=timed, user=user,
    )


def check_sweep_caps(session: Session, created_by: str) -> None:
    """Refuse a sweep past `KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER` queued or running sweeps of one user:
    the jobs' cap (`app.services.jobs.check_caps`, under the jobs' lock), called after the new row
    is flushed, so it counts itself."""
    check_caps(session, created_by, kind=SWEEPS)


def start_sweep(session: Session, notebook: Notebook, body: SweepCreate,
                created_by: str = LOCAL_USER) -> Sweep:
    """Check everything, commit the sweep and its runs, then send one message per edit. Raises
    `Unprocessable` (nothing saved), `RunLimitReached` (rolled back) or `QueueUnavailable` (the sweep
    and its runs deleted again)."""
    check_served(notebook.model, "model")
    question = sweep_question(notebook, body)
    planned: PlannedEdits = plan_edits(notebook, body, question.choices)
    if planned.extended:  # values outside the choices, added to them on request
        question = question.model_copy(update={"choices": [*question.choices, *planned.extended]})
    sweep = Sweep(notebook_id=notebook.id, model=notebook.model, question=question,
                  strategies=list(body.strategies), threshold=body.threshold, mode=planned.mode,
                  status=RunStatus.QUEUED, edits_total=len(planned.edits), edits_done=0,
                  edits_skipped=planned.skipped, document_prefills=0, created_by=created_by,
                  stop_when_decided=body.stop_when_decided,
                  extended_choices=list(planned.extended) or None)
    runs: list[Run] = []

    def edits() -> None:  # once the sweep is flushed (its id) and counted against its cap
        check_sweep_caps(session, created_by)
        runs.extend(Run(notebook_id=notebook.id, kind="edit",
                        snapshot=edit_snapshot(notebook, question, sweep.strategies, edit, sweep.id,
                                               timed=i < body.timed_edits, user=created_by),
                        strategies=list(sweep.strategies), status=RunStatus.QUEUED, stage="queued",
                        progress=0.0, timings={}, created_by=created_by, sweep_id=sweep.id, sweep_edit=edit)
                    for i, edit in enumerate(planned.edits))
        session.add_all(runs)

    def send() -> None:
        for run in runs:
            enqueue_run(run, priority=SWEEP_PRIORITY)

    enqueue_or_unsave(session, [sweep], send, check=edits, made_with=runs)
    return sweep


def cancel_sweep(session: Session, sweep: Sweep) -> int:
    """Cancel the sweep and its unfinished edits (finished ones are kept and counted) with the jobs'
    cancel (`app.services.jobs.cancel`: conditional transitions, one transaction); returns how many
    edits were cancelled. A finished sweep is left as it is (0)."""
    cancelled: list[str | None] = []

    def edits() -> list[str | None]:
        cancelled.extend(cancel_edits(session, sweep.id))
        finished = session.scalar(select(func.count(Run.id)).where(
            Run.sweep_id == sweep.id, Run.status.in_((RunStatus.SUCCEEDED, RunStatus.FAILED)))) or 0
        session.execute(update(Sweep).where(Sweep.id == sweep.id).values(
            edits_done=finished, stopped=STOPPED_CANCELLED,
            error=f"cancelled after {finished} of {sweep.edits_total} edits; the finished ones are kept"))
        return cancelled

    if not cancel(session, sweep, also=edits):
        return 0
    return len(cancelled)


@action
def adopt_policy(session: Session, sweep: Sweep, threshold: float | None = None,
                 per_field: bool = False) -> Notebook:
    """Store the finished sweep's policy at `threshold` (None: the sweep's own) on its notebook:
    the strategy it names, the sweep, the threshold and its sentence. Later runs' `auto` runs only
    that strategy. With `per_field`, also each field's own policy (a sweep that edited its fields
    separately): a later run's `auto` then runs the strategy of the field(s) it edits. A sweep
    still running, with no finished edit, whose notebook is gone, or (per field) that has no
    per-field policy is refused."""
    notebook = session.get(Notebook, sweep.notebook_id) if sweep.notebook_id is not None else None
    if notebook is None:
        raise Unprocessable("sweep", f"sweep {sweep.id}'s notebook was deleted: there is no notebook "
                                     "to adopt its policy")
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise Unprocessable("threshold", f"threshold must be between 0 and 1 (exclusive); got {threshold}")
    view = build_sweep_view(session, sweep, threshold)
    if view.active:
        raise Unprocessable("sweep", f"sweep {sweep.id} is {view.status} ({view.progress}): adopt its "
                                     "policy once it has finished")
    if not any(e.results for e in view.edits):
        raise Unprocessable("sweep", f"sweep {sweep.id} has no finished edit: it has no policy to adopt")
    if per_field and not view.policy.per_field:
        raise Unprocessable("per_field", f"sweep {sweep.id} has no per-field policy: it edited "
                                         "one field, or several together in each edit; adopt its "
                                         "overall policy")
    notebook.policy_strategy, notebook.policy_sweep_id = view.policy.strategy, sweep.id
    notebook.policy_threshold, notebook.policy_sentence = view.policy.threshold, view.policy.sentence
    notebook.policy_fields = [
        FieldPolicy(field=p.field, strategy=p.strategy, threshold=p.threshold, sentence=p.sentence,
                    cost_share=p.cost_share) for p in view.policy.per_field] if per_field else None
    return notebook


@action
def drop_policy(session: Session, notebook: Notebook) -> Notebook:
    """Forget the notebook's adopted policy: `auto` is the oracle pick again."""
    notebook.policy_strategy = notebook.policy_sweep_id = None
    notebook.policy_threshold = notebook.policy_sentence = None
    notebook.policy_fields = None
    return notebook
