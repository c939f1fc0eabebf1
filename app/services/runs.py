"""Runs: the snapshot of exactly what a run runs on, and creating a run (row first, then the
message; committed only once the broker has taken it)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.models import Notebook, Question, Run
from app.queue import enqueue_run
from app.schemas import (
    RunSnapshot,
    SnapshotField,
    SnapshotPlacement,
    SnapshotQuestion,
)


def build_snapshot(notebook: Notebook, question: Question, strategies: list[str]) -> dict:
    """A JSON-ready copy of everything the worker needs, so later edits never change the run:
    model, document, fields, errata texts in order, placements (skill name, text, position),
    the question and the strategies. Validated by `RunSnapshot` on the way out."""
    snapshot = RunSnapshot(
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
    )
    return snapshot.model_dump()


def start_run(session: Session, notebook: Notebook, question: Question, strategies: list[str]) -> Run:
    """Create the run row, enqueue it, and commit only after the broker took the message.
    Raises `QueueUnavailable` (after rolling back) when it did not."""
    run = Run(
        notebook_id=notebook.id,
        kind="edit",
        snapshot=build_snapshot(notebook, question, strategies),
        strategies=list(strategies),
        status="queued",
        stage="queued",
        progress=0.0,
        timings={},
    )
    session.add(run)
    session.flush()
    try:
        run.task_id = enqueue_run(run)
    except Exception:
        session.rollback()
        raise
    session.commit()
    return run
