"""The FastAPI application: the JSON API under /api, static files, and the HTML pages when the
`app.web.pages` module is present. Imports no torch and nothing of the worker."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from app.api.routes import errata, fields, health, notebooks, placements, runs, skills
from app.services.errors import Unprocessable

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def _has_module(name: str) -> bool:
    parent = name.rpartition(".")[0]
    return (not parent or _has_module(parent)) and importlib.util.find_spec(name) is not None


async def _unprocessable(_request: Request, exc: Exception) -> JSONResponse:
    """Same shape as FastAPI's validation errors: the field to blame and what is wrong."""
    assert isinstance(exc, Unprocessable)
    detail = [{"loc": ["body", field], "msg": message, "type": "value_error"} for field, message in exc.errors.items()]
    return JSONResponse(status_code=422, content={"detail": detail})


def create_app() -> FastAPI:
    app = FastAPI(
        title="kvnotes",
        summary="Edit and compose a language model's KV cache (its notes) instead of paying for prefill again.",
        version="0.1.0",
    )
    api = APIRouter(prefix="/api")
    for module in (notebooks, fields, errata, skills, placements, runs, health):
        api.include_router(module.router)
    app.include_router(api)
    app.add_exception_handler(Unprocessable, _unprocessable)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    if _has_module("app.web.pages"):
        app.include_router(importlib.import_module("app.web.pages").router)
    return app


app = create_app()
