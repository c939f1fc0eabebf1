"""What `/api/health` reports: the database writable, the broker reachable, and a live worker ready
for every offered model (one still loading or converting its model is named: "starting: converting
smollm2-135m"; health is "ok" only when a run could start). Each part is "ok" or one plain line
saying what is wrong (never an SQL statement, never a password); the whole is "ok" only when every
part is.

A read writes nothing: `/api/health` is public and exempt from the request limiter, so anyone could
otherwise drive writes. Writability is judged without writing (`database_status`): the database is
read (the liveness row), a SQLite file must be writable by this process and not opened read-only,
its disk must have room, a PostgreSQL database must not be read-only. The liveness row
(`health_probe`) is written by the workers' beat (`write_liveness`, every few seconds) and read
here: while a worker of this machine is alive but neither its beat nor the liveness row has been
written for `LIVENESS_STALE_S`, writes are not landing, and health says so.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime

from sqlalchemy import DateTime, Integer, select, text, update
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Mapped, Session, mapped_column

from data.models import Base, as_utc, db_now, utcnow
from data.queue import broker_status
from data.settings import get_settings
from data.watchdog import unserved_queued_models
from data.workers import Worker, models_starting, models_without_worker

LIVENESS_STALE_S = 30.0  # the beat writes every 5 s: this many seconds without one is a fault
MIN_FREE_BYTES = 256 * 1024  # less room than this on a SQLite database's disk: a write would fail


class HealthProbe(Base):
    __tablename__ = "health_probe"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    checked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


def plain_database_error(exc: BaseException) -> str:
    """One line about a database failure without the SQL statement or parameters SQLAlchemy puts
    in its messages: the driver's own first line ("attempt to write a readonly database")."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    first = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
    return first[:200]


def write_liveness(session: Session) -> None:
    """The beat's write (the caller commits): the liveness row says a write just landed."""
    now = db_now(session)  # the database's clock, as the workers' beats (`data.workers`)
    found = session.execute(update(HealthProbe).where(HealthProbe.id == 1).values(checked_at=now))
    if found.rowcount == 0:
        session.add(HealthProbe(id=1, checked_at=now))


def database_status(session: Session) -> str:
    """'ok' when the database can be read and nothing says it cannot be written; else why not.
    Writes nothing (see the module's docstring)."""
    try:
        last = as_utc(session.scalar(select(HealthProbe.checked_at).where(HealthProbe.id == 1)))
        why = _cannot_write(session) or _beat_not_landing(session, last)
        session.rollback()  # end the read: nothing was written
    except SQLAlchemyError as exc:
        session.rollback()
        return f"not writable: {plain_database_error(exc)}"
    return f"not writable: {why}" if why else "ok"


def _cannot_write(session: Session) -> str | None:
    """Why this database cannot take a write, found without writing; None when nothing says so."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        read_only = session.scalar(text("SELECT current_setting('transaction_read_only')"))
        if read_only == "on" or session.scalar(text("SELECT pg_is_in_recovery()")):
            return "cannot execute a write in a read-only transaction (the database is read-only)"
        return None
    database = bind.url.database or ""
    query = bind.url.query
    if "mode=ro" in database or query.get("mode") == "ro" or "immutable=1" in database:
        return "attempt to write a readonly database (opened read-only)"
    path = database.removeprefix("file:").split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    for name in (path, f"{path}-wal", f"{path}-shm", os.path.dirname(path) or "."):
        if os.path.exists(name) and not os.access(name, os.W_OK):
            return f"attempt to write a readonly database ({os.path.basename(name)} is not writable)"
    free = shutil.disk_usage(os.path.dirname(path) or ".").free
    if free < MIN_FREE_BYTES:
        return f"database or disk is full ({free} bytes free)"
    return None


def _beat_not_landing(session: Session, last: datetime | None) -> str | None:
    """A live worker of this machine whose beat (with the liveness row) has not landed for
    `LIVENESS_STALE_S`: its writes fail. None otherwise (no worker beats here: nothing to judge)."""
    now = db_now(session)
    if last is not None and (now - last).total_seconds() < LIVENESS_STALE_S:
        return None
    beating = [w for w in session.scalars(select(Worker).where(Worker.stopped_at.is_(None)))
               if not w.process_gone() and w.pid > 0 and w.host and not _elsewhere(w)]
    if not beating:
        return None
    beats = [as_utc(w.beat_at) for w in beating if w.beat_at is not None]
    last = max([moment for moment in (last, *beats) if moment is not None], default=None)
    if last is not None and (now - last).total_seconds() < LIVENESS_STALE_S:
        return None  # a registry beat landed (the same write; a worker of an older version beats so)
    ago = "never" if last is None else f"{(now - last).total_seconds():.0f} s ago"
    return f"the workers' beat has not been written for {LIVENESS_STALE_S:.0f} s (last: {ago})"


def _elsewhere(worker: Worker) -> bool:
    import socket

    return worker.host != socket.gethostname()[:200]


def workers_status(session: Session) -> str:
    """'ok' when every offered model has a live worker ready to take a run and no run waits for a
    model nobody serves; else which models lack one, and what a starting worker still does."""
    models = get_settings().models
    try:
        missing = models_without_worker(session, models)
        starting = models_starting(session, [m for m in models if m not in missing])
        unserved = unserved_queued_models(session)
    except SQLAlchemyError as exc:
        session.rollback()
        return f"unknown (database: {plain_database_error(exc)})"
    problems = [f"no live worker for {', '.join(missing)}"] if missing else []
    if starting:
        problems.append(f"starting: {', '.join(dict.fromkeys(starting.values()))}")
    if unserved:
        problems.append(f"runs queued for {', '.join(unserved)}, which no worker serves (KVNOTES_MODELS)")
    return "; ".join(problems) or "ok"


def health(session: Session) -> dict[str, str]:
    """{status, database, broker, workers}: status "ok" or "degraded"."""
    parts = {"database": database_status(session), "broker": broker_status(),
             "workers": workers_status(session)}
    status = "ok" if all(v == "ok" for v in parts.values()) else "degraded"
    return {"status": status, **parts}
