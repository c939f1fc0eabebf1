"""What `/api/health` reports: the database writable, the broker reachable, and a live worker ready
for every offered model (one still loading or converting its model is named: "starting: converting
smollm2-135m"; health is "ok" only when a run could start). Each part is "ok" or one plain line
saying what is wrong (never an SQL statement, never a password); the whole is "ok" only when every
part is.

Writability is checked by really writing: one row of `health_probe` is updated and committed, so a
read-only database or a full disk shows here before a user's edit fails.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, update
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Mapped, Session, mapped_column

from data.models import Base, utcnow
from data.queue import broker_status
from data.settings import get_settings
from data.watchdog import unserved_queued_models
from data.workers import models_starting, models_without_worker


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


def database_status(session: Session) -> str:
    """'ok' when a row can be written and committed; else why not."""
    try:
        found = session.execute(update(HealthProbe).where(HealthProbe.id == 1).values(checked_at=utcnow()))
        if found.rowcount == 0:
            session.add(HealthProbe(id=1))
        session.commit()
        return "ok"
    except SQLAlchemyError as exc:
        session.rollback()
        return f"not writable: {plain_database_error(exc)}"


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
