"""Keeping a finished run's renders (`data.renders`, under the data folder; a finished trajectory's
report too): found by run, key and version, and stored once built. Storing is best effort: a data
folder that cannot be written (full, read-only) costs the next request a render again, never this
request its answer.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from data.models import Run
from data.renders import Render, find_render, forget_gone_runs, put_render, run_tag
from data.trajectories import Trajectory

log = logging.getLogger(__name__)


def stored_render(run: Run | Trajectory, key: str, version: str) -> Render | None:
    return find_render(run_tag(run), key, version)


def keep_render(session: Session, run: Run | Trajectory, key: str, version: str, render: Render) -> bool:
    """Store `render` (and drop the renders of runs deleted since); False (logged) when it could not."""
    run_id = run.id
    try:
        put_render(run_tag(run), key, version, render)
        forget_gone_runs(session)
        return True
    except (OSError, SQLAlchemyError) as exc:
        log.warning("run: could not store its render",
                    extra={"run_id": run_id, "render": key, "reason": type(exc).__name__})
        return False
