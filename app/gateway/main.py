"""The app `kvnotes gateway` serves: the OpenAI API at `/v1` and `/metrics`, nothing else (no pages,
no accounts: it binds to loopback unless told otherwise, and reaches only its one upstream). The
Gateway page is in the web app (`kvnotes serve`), which also mounts the same routes at `/gateway/v1`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from app.gateway.routes import metrics_router, openai_error, router
from app.services.gateway import aclose


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    """At shutdown, this process's gateway closes its upstream pools and state connections (also
    the web app's lifespan, which mounts the same gateway)."""
    yield
    await aclose()


def create_app() -> FastAPI:
    app = FastAPI(title="kvnotes gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.include_router(router, prefix="/v1")
    app.include_router(metrics_router)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        return openai_error(422, "; ".join(str(e.get("msg")) for e in exc.errors())[:500])

    return app


def __getattr__(name: str) -> FastAPI:
    """`app.gateway.main:app`, made when uvicorn first asks for it (never on import)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = create_app()
    globals()["app"] = made
    return made
