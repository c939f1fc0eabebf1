"""Dependencies and small helpers shared by the API routes and pages: the database session, who
is asking (set by `app.security.guard`), and 404s (ids past the database's integers are 404s too)."""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from app.security.principal import Principal
from data.accounts import LOCAL_USER
from data.db import get_session, highest_issued_id

SessionDep = Annotated[Session, Depends(get_session)]
MAX_DB_ID = 2**63 - 1


def current_principal(request: Request) -> Principal:
    """Who is asking (the guard ran first; "local" on the embedded default)."""
    return getattr(request.state, "principal", None) or Principal(LOCAL_USER, "editor", "local")


PrincipalDep = Annotated[Principal, Depends(current_principal)]

T = TypeVar("T")


class Deleted(HTTPException):
    """404 for the address of a notebook or run that was deleted (its id is never given to another):
    the page is titled "Deleted" and says so."""

    title = "Deleted"

    def __init__(self, detail: str) -> None:
        super().__init__(status_code=404, detail=detail)


def get_or_404(session: Session, model: type[T], ident: int, name: str) -> T:
    """The row `ident` of `model`, or a 404 that names what was missing, and says so when it was
    deleted (ids are never reused: an id at or below the highest one issued and missing is gone)."""
    row = session.get(model, ident) if abs(ident) <= MAX_DB_ID else None
    if row is None:
        table = getattr(model, "__tablename__", "")
        if 0 < ident <= MAX_DB_ID and ident <= highest_issued_id(session, table):
            raise Deleted(f"{name} {ident} was deleted; this address will never show anything else")
        raise HTTPException(status_code=404, detail=f"{name} {ident} not found")
    return row


def errors(*codes: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI `responses=` for the error answers a route may give (422 is FastAPI's own)."""
    from app.schemas import ErrorOut

    return {code: {"model": ErrorOut} for code in codes}
