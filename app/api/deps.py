"""Dependencies and small helpers shared by the API routes: the database session and 404s."""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException
from sqlalchemy.orm import Session

from data.db import get_session

SessionDep = Annotated[Session, Depends(get_session)]

T = TypeVar("T")


def get_or_404(session: Session, model: type[T], ident: int, name: str) -> T:
    """The row `ident` of `model`, or a 404 that names what was missing."""
    row = session.get(model, ident)
    if row is None:
        raise HTTPException(status_code=404, detail=f"{name} {ident} not found")
    return row


def errors(*codes: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI `responses=` for the error answers a route may give (422 is FastAPI's own)."""
    from app.schemas import ErrorOut

    return {code: {"model": ErrorOut} for code in codes}
