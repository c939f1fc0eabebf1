"""Health: is the database writable, the broker reachable, and is there a live worker for every
offered model? 200 when all are, else 503 naming what is down (`data.health`).

It reads and writes on a connection pool of its own (`data.db.get_health_sessionmaker`) and is
never held back by the request limiter (`app.api.capacity`): it answers while the app is saturated."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.schemas import HealthOut
from data.db import get_health_sessionmaker
from data.health import health as check_health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut, responses={503: {"model": HealthOut}})
def health(response: Response) -> HealthOut:
    with get_health_sessionmaker()() as session:
        report = HealthOut(**check_health(session))
    if report.status != "ok":
        response.status_code = 503
    return report
