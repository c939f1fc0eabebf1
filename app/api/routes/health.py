"""Health: can this web process reach its database and its broker? 200 when both, else 503."""

from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import text

from app.api.deps import SessionDep
from app.schemas import HealthOut
from data.queue import broker_status

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut, responses={503: {"model": HealthOut}})
def health(session: SessionDep, response: Response) -> HealthOut:
    try:
        session.execute(text("SELECT 1"))
        database = "ok"
    except Exception as exc:
        database = f"unreachable: {exc}"
    broker = broker_status()
    ok = database == "ok" and broker == "ok"
    if not ok:
        response.status_code = 503
    return HealthOut(status="ok" if ok else "degraded", database=database, broker=broker)
