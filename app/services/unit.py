"""One user action, one commit: the only place in `app/` outside the services' own modules where the
database session is committed.

Every public action of a service (`app.services.notebooks`, `app.services.skills`, ...) is an
`@action`: it commits when it returns and rolls back when it raises, so a route or a page calls it
and is done. Actions nest: `saving(session)` around several of them (an example loaded whole, a form
that validates then creates and compiles) commits once, when the outermost block ends, and an
exception anywhere inside rolls the whole back, so nothing half-made is saved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from sqlalchemy.orm import Session, object_session

P = ParamSpec("P")
R = TypeVar("R")
_DEPTH = "kvnotes.unit_depth"  # key in `Session.info`: how many `saving` blocks are open


@contextmanager
def saving(session: Session) -> Iterator[Session]:
    """Commit what the block did when the outermost block ends; roll all of it back if it raises."""
    depth = session.info.get(_DEPTH, 0)
    session.info[_DEPTH] = depth + 1
    try:
        yield session
    except BaseException:
        session.info[_DEPTH] = depth
        if depth == 0:
            session.rollback()
        raise
    session.info[_DEPTH] = depth
    if depth == 0:
        session.commit()


def _session_of(first: object) -> Session:
    if isinstance(first, Session):
        return first
    session = object_session(first)
    if session is None:
        raise RuntimeError(f"an action's first argument must be a session or a row in one; got {first!r}")
    return session


def action(fn: Callable[P, R]) -> Callable[P, R]:
    """Make `fn` (whose first argument is the session, or a row attached to it) one transaction."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with saving(_session_of(args[0])):
            return fn(*args, **kwargs)

    return run
