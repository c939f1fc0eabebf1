"""Health: is the database writable, the broker reachable, and is there a live worker for every
offered model? 200 when all are, else 503 naming what is down (`data.health`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import SessionDep
from app.schemas import HealthOut
from data.health import health as check_health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut, responses={503: {"model": HealthOut}})
def health(session: SessionDep, response: Response) -> HealthOut:
    report = HealthOut(**check_health(session))
    if report.status != "ok":
        response.status_code = 503
    return report
