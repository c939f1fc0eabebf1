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
def saving(session: Session, keeps: tuple[type[BaseException], ...] = ()) -> Iterator[Session]:
    """Commit what the block did when the outermost block ends; roll all of it back if it raises,
    unless it raises one of `keeps`: a refusal that is an answer, whose record must stand (a
    refused sign-in counts against the limit), so what was done is committed, then it propagates."""
    depth = session.info.get(_DEPTH, 0)
    session.info[_DEPTH] = depth + 1
    try:
        yield session
    except keeps:
        session.info[_DEPTH] = depth
        if depth == 0:
            session.commit()
        raise
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


def action(fn: Callable[P, R] | None = None, *, keeps: tuple[type[BaseException], ...] = ()):
    """Make `fn` (whose first argument is the session, or a row attached to it) one transaction:
    `@action`, or `@action(keeps=(Refusal,))` for one whose refusals `Refusal` are saved with what
    the action did before refusing (`saving`'s `keeps`)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with saving(_session_of(args[0]), keeps):
                return fn(*args, **kwargs)

        return run

    return wrap if fn is None else wrap(fn)
