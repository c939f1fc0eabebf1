"""The lock order of a notebook's rows (issue 49, "Rows"): the notebook first, then its parts.

Every action that changes a notebook or what hangs on it (a field, an erratum, a placement, the
question) starts with `hold`, and a notebook's delete locks the notebook's row before the database
cascades to its parts (`app.services.notebooks.delete_notebook`), so two of them never wait on each
other in opposite orders ("deadlock detected" on PostgreSQL); a part or notebook gone under the
request is `Gone`, a 404. Measured: 40 rounds of nine operations released together on one notebook
(its DELETE and PATCH, a field's PATCH, DELETE, form delete and create, an erratum's PATCH, DELETE
and create) gave 3 x 500 and 42 x 503 on PostgreSQL before; none now
(tests/api/test_delete_races.py).
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session, object_session

from app.services.errors import Gone
from data.models import Erratum, Field, Notebook, Placement, utcnow


def touch_first(session: Session, notebook_id: int, what: str) -> None:
    """Mark notebook `notebook_id` changed, in the database and as the transaction's first write,
    before a part of it (`what`, e.g. "field 7") is changed or deleted. The row lock this takes
    orders the change after, or before, a delete of the whole notebook (on PostgreSQL as on SQLite,
    where the first write takes the database's write lock), so the two never interleave; when the
    notebook is already gone (and its parts with it), `Gone`: a 404, never a 500 for a notebook that
    vanished under the request (`touch(field.notebook)` read None)."""
    done = session.execute(update(Notebook).where(Notebook.id == notebook_id).values(updated_at=utcnow()))
    if done.rowcount == 0:
        gone = f"notebook {notebook_id} was deleted" if what.startswith("notebook ") else \
            f"{what} was deleted with its notebook {notebook_id}"
        raise Gone(gone)


def hold(row: Notebook | Field | Erratum | Placement) -> None:
    """The first statement of every action that changes a notebook or what hangs on it: lock order
    is the notebook, then its parts (issue 49: a field's PATCH wrote the field, then the notebook,
    while the notebook's DELETE held the notebook and cascaded to the field: "deadlock detected").
    Takes the notebook's row (`touch_first`), then checks that `row`, read before the lock, is still
    there (a part deleted meanwhile: `Gone`, a 404, not a 409 or a 500 on a vanished row)."""
    session = object_session(row)
    assert session is not None, row
    if isinstance(row, Notebook):
        touch_first(session, row.id, f"notebook {row.id}")
        return
    kind = type(row)
    what = f"{kind.__name__.lower()} {row.id}"  # field, erratum or placement
    touch_first(session, row.notebook_id, what)
    if session.scalar(select(kind.id).where(kind.id == row.id)) is None:
        raise Gone(f"{what} was deleted meanwhile")


def lost_race(exc: BaseException) -> bool:
    """A transaction PostgreSQL rolled back to break a deadlock or a serialization conflict (SQLSTATE
    40P01, 40001): tried again, it goes through."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in ("40P01", "40001")
