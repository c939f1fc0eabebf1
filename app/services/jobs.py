"""The web's side of the one job lifecycle (`data.jobs`), which runs, sweeps, trajectories and
replays all use: the caps, enqueue-or-unsave, and cancel.

- **Caps** (`check_caps`): `KVNOTES_MAX_ACTIVE_RUNS_PER_USER` jobs queued or running per user and
  `KVNOTES_MAX_ACTIVE_RUNS` in all, counting runs, trajectories and replays together; a sweep
  (`data.jobs.SWEEPS`: its edits queue behind runs) counts against
  `KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER` instead. Checked after the new row is flushed (so it counts
  itself): on SQLite the flush holds the write lock, on PostgreSQL one advisory lock (`JOBS_LOCK`)
  serializes the creation of every kind, so two requests at once cannot both slip under a cap.
- **Enqueue or unsave** (`enqueue_or_unsave`): the rows (with their message tokens) are committed
  first, so a worker never sees a message before its row; then the messages are sent; a broker
  that refuses one deletes the rows again (and what was made with them), so nothing is saved.
- **Cancel** (`cancel`): one conditional transition (`data.jobs.transition`) moves an unfinished job
  to cancelled (its worker stops at its next write, and its success write then changes nothing) and
  its message is revoked; a job that finished first — even a moment before — keeps its outcome and
  the caller is told so. A sweep's edit cancelled alone refreshes its sweep, which may end with it;
  a sweep is cancelled the same way, its edits with it (`app.services.sweeps.cancel_sweep`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.services.errors import RunLimitReached
from app.services.unit import saving
from data.jobs import ACTIVE, SWEEPS, active_jobs, finish, kind_of
from data.models import Run, RunStatus, Sweep
from data.queue import QueueUnavailable, revoke
from data.settings import get_settings

log = logging.getLogger(__name__)
JOBS_LOCK = 7061504  # "kvnotes runs": the PostgreSQL advisory lock every job's creation takes


def check_caps(session: Session, created_by: str, counting_itself: bool = True, kind=None) -> None:
    """Refuse a job past the caps (`RunLimitReached`, 429); `kind` SWEEPS: a sweep past the sweeps'
    cap. `counting_itself`: the new row is already flushed (else it is counted as one more)."""
    if counting_itself and session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SELECT pg_advisory_xact_lock({JOBS_LOCK})"))
    settings = get_settings()
    extra = 0 if counting_itself else 1
    if kind is SWEEPS:
        limit = settings.max_active_sweeps_per_user
        mine = (session.scalar(select(func.count(Sweep.id)).where(
            Sweep.status.in_(ACTIVE), Sweep.created_by == created_by)) or 0) + extra
        if mine > limit:
            raise RunLimitReached(
                f"{created_by} has {mine - 1} sweeps queued or running; the limit is {limit} per user "
                "(KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER): wait for one to finish or cancel it")
        return
    mine = active_jobs(session, created_by) + extra
    if mine > settings.max_active_runs_per_user:
        raise RunLimitReached(
            f"{created_by} has {mine - 1} runs, trajectories and replays queued or running; the limit is "
            f"{settings.max_active_runs_per_user} per user (KVNOTES_MAX_ACTIVE_RUNS_PER_USER): "
            "wait for one to finish, or cancel one")
    everyone = active_jobs(session) + extra
    if everyone > settings.max_active_runs:
        raise RunLimitReached(
            f"{everyone - 1} runs, trajectories and replays are queued or running; the limit is "
            f"{settings.max_active_runs} in all (KVNOTES_MAX_ACTIVE_RUNS): wait for some to finish")


def enqueue_or_unsave(session: Session, rows: Iterable[Any], send: Callable[[], None],
                      check: Callable[[], None] | None = None, made_with: Iterable[Any] = ()) -> None:
    """Commit `rows` (after `check`, run once they are flushed: the caps), then `send()` their
    messages. When the broker refuses (`QueueUnavailable`, raised on), the rows and what was
    `made_with` them (a question asked with a run) are deleted again. `check` raising rolls all back."""
    rows = list(rows)
    with saving(session):
        session.add_all(rows)
        session.flush()
        if check is not None:
            check()
    try:
        send()
    except QueueUnavailable:
        _unsave(session, [*made_with, *rows])
        raise


def _unsave(session: Session, rows: list[Any]) -> None:
    """Delete rows the broker took no message for (a message already sent finds no row: dropped)."""
    try:
        with saving(session):
            for row in rows:
                session.delete(row)
    except SQLAlchemyError as exc:  # the rows stay `queued` without a message: the reaper fails them
        log.error("job could not be queued nor deleted",
                  extra={"rows": [f"{type(r).__name__} {r.id}" for r in rows], "reason": type(exc).__name__})


def cancel(session: Session, row: Any, error: str | None = None, tokens: Iterable[str] = (),
           also: Callable[[], Iterable[str | None]] | None = None) -> bool:
    """Move the unfinished job `row` (a run, trajectory, replay or sweep) to cancelled, with `error`
    (the sentence it then shows), by one conditional transition, with `also()` in the same
    transaction (a sweep's edits: the tokens to revoke); commit, and revoke its message (and
    `tokens`). False, nothing changed, when it had finished first (`row` then reads its outcome).
    A sweep's edit cancelled so refreshes its sweep."""
    kind = SWEEPS if isinstance(row, Sweep) else kind_of(row)
    extra: list[str | None] = []
    with saving(session):
        if not finish(session, kind, row.id, RunStatus.CANCELLED, error):
            session.refresh(row)  # what it finished as
            return False
        if also is not None:
            extra += list(also())
    session.refresh(row)
    for token in [getattr(row, "task_id", None), *tokens, *extra]:
        if token:
            revoke(token)
    if isinstance(row, Run) and row.sweep_id is not None:
        from data.sweep_edits import refresh_sweep  # (the sweeps' own module imports this one)

        refresh_sweep(session, row.sweep_id)
    return True
