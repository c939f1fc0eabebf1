"""Runs: the snapshot of exactly what a run runs on, and creating a run (the row, with its message
token, committed first; then the message; if the broker refuses it, the row and a question asked
with it are deleted again, so nothing is saved and no message exists without its run), the question
a run asks, and cancelling."""

from __future__ import annotations

import logging

from sqlalchemy import inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.schemas import RunCreate
from app.services.errors import Unprocessable
from app.services.jobs import cancel, check_caps, enqueue_or_unsave
from app.services.notebooks import check_served, new_question
from data.accounts import LOCAL_USER
from data.contracts import RunSnapshot, SnapshotField, SnapshotPlacement, SnapshotQuestion
from data.models import RUN_ACTIVE, Notebook, Question, Run, RunStatus
from data.queue import enqueue_run
from data.workers import models_starting, models_without_worker
from vocabulary import by_role
from vocabulary.sweep_policy import apply_policy
from vocabulary.sweeps import Policy

log = logging.getLogger(__name__)
ACTIVE = RUN_ACTIVE
AUTO = by_role("composite")  # the strategy that applies a notebook's adopted policy


def build_snapshot(notebook: Notebook, question: Question, strategies: list[str],
                   attribution: bool = False, mechanism: bool = False,
                   user: str | None = None) -> RunSnapshot:
    """A copy of everything the worker needs, so later edits never change the run: model,
    document, fields, errata texts in order, placements (skill name, text, position), the question,
    the strategies and who started it (the KV store's per-user scope)."""
    return RunSnapshot(
        model=notebook.model,
        document=notebook.document,
        fields=[
            SnapshotField(start=f.start, end=f.end, old=f.old_value, new=f.new_value, label=f.label)
            for f in sorted(notebook.fields, key=lambda f: f.start)
        ],
        errata=[e.text for e in sorted(notebook.errata, key=lambda e: (e.position, e.id))],
        placements=[
            SnapshotPlacement(skill_id=p.skill_id, name=p.skill.name, text=p.skill.text, position=p.position)
            for p in notebook.placements
        ],
        question=SnapshotQuestion(text=question.text, choices=list(question.choices), cot=question.cot),
        strategies=list(strategies),
        attribution=attribution,
        mechanism=mechanism,
        user=user,
        **(adopted_policy(notebook) if AUTO in strategies else {}),
    )


def adopted_policy(notebook: Notebook) -> dict[str, str | None]:
    """The snapshot's `policy` (what `auto` runs) and `policy_note` (why) under the notebook's
    adopted policy: the overall strategy, or, with per-field policies, the strategy of the field(s)
    this run edits (several: the most conservative, stated; `vocabulary.sweeps.apply_policy`)."""
    if notebook.policy_strategy is None:
        return {}
    if not notebook.policy_fields:
        return {"policy": notebook.policy_strategy}
    edited = [f.label or f"the unlabelled field at {f.start}"
              for f in sorted(notebook.fields, key=lambda f: f.start) if f.new_value != f.old_value]
    per_field = [Policy(p.strategy, p.threshold, p.sentence, p.field, p.cost_share)
                 for p in notebook.policy_fields]
    applied = apply_policy(notebook.policy_strategy, per_field, edited)
    return {"policy": applied.strategy, "policy_note": applied.note}


def start_run(session: Session, notebook: Notebook, question: Question, strategies: list[str],
              attribution: bool = False, created_by: str = LOCAL_USER, mechanism: bool = False) -> Run:
    """Create and commit the run row, then send its message (`app.services.jobs`). Raises
    `RunLimitReached` (rolled back) or `QueueUnavailable` (the run and a question new with it
    deleted again: nothing is saved)."""
    new_question = question if inspect(question).transient or inspect(question).pending else None
    snapshot = build_snapshot(notebook, question, strategies, attribution, mechanism,  # (may flush it)
                              user=created_by)
    return _enqueue(session, notebook.id, snapshot, created_by, new_question)


def rerun_snapshot(session: Session, run: Run, created_by: str = LOCAL_USER) -> Run:
    """Run exactly what `run` ran on again (its snapshot, not the notebook as it is now): a new
    run of the same notebook. Same caps and failure policy as `start_run`. A sweep's edit runs
    again as an ordinary run: not counted on the sweep, and with the attention maps a sweep does
    not keep."""
    return _enqueue(session, run.notebook_id, run.snapshot.model_copy(update={"sweep_id": None}), created_by)


def _enqueue(session: Session, notebook_id: int | None, snapshot: RunSnapshot, created_by: str,
             new_question: Question | None = None) -> Run:
    check_served(snapshot.model, "model")
    run = Run(notebook_id=notebook_id, kind="edit", snapshot=snapshot, strategies=list(snapshot.strategies),
              status=RunStatus.QUEUED, stage="queued", progress=0.0, timings={}, created_by=created_by)
    enqueue_or_unsave(session, [run], lambda: enqueue_run(run), check=lambda: check_caps(session, created_by),
                      made_with=[new_question] if new_question is not None else [])
    return run


def question_for(notebook: Notebook, body: RunCreate) -> Question:
    """The question asked: the request's (which becomes the notebook's current one) or the current."""
    current = notebook.question
    if body.question is None:
        if current is None:
            raise Unprocessable("question", "this notebook has no question yet; send one with the run")
        if body.choices is None and body.cot is None:
            return current
    text = body.question if body.question is not None else current.text  # type: ignore[union-attr]
    choices = body.choices if body.choices is not None else (current.choices if current else [])
    cot = body.cot if body.cot is not None else (current.cot if current else False)
    return new_question(notebook, text, list(choices), cot)


def cancel_run(session: Session, run: Run) -> bool:
    """Mark an unfinished run cancelled (the worker checks between stages) and revoke its task;
    False (and nothing changed) when it already finished."""
    return cancel(session, run)


def worker_step(session: Session, run: Run) -> str | None:
    """What the worker that will take queued `run` still does before it can ("converting
    gemma3-270m (first use): 120 of 236 tensors"), or None (not queued, or a ready worker serves its
    model). Best effort: a database that cannot be read says nothing."""
    if run.status != RunStatus.QUEUED:
        return None
    try:
        return models_starting(session, [run.model]).get(run.model)
    except SQLAlchemyError:
        session.rollback()
        return None


def waits_without_worker(session: Session, run: Run) -> bool:
    """True when `run` is queued and no live worker serves its model (its page says so). Best
    effort: a database that cannot be read says nothing."""
    if run.status != RunStatus.QUEUED:
        return False
    try:
        return bool(models_without_worker(session, [run.model]))
    except SQLAlchemyError:
        session.rollback()
        return False
