"""The FastAPI application: the JSON API under /api, static files, and the HTML pages when the
`app.web.router` module is present. Imports no torch and nothing of the worker.

Every request passes the security middleware (Host allowlist, cross-site refusal, headers) and
every route the authorization gate (`app.security.guard.authorize`); errors are answered by
`app.api.handlers`. The secret key is settled when the app is made (`data.signing.ensure_secret_key`),
which is when a server first asks for `app.main:app`, never on import: a key file that cannot be
written stops the start with one line, rather than failing a sign-in later. The interactive /docs
page is off: it needs inline script and a CDN, which the Content-Security-Policy forbids; the schema
is at /openapi.json."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from app.api import handlers, refusals
from app.api.capacity import CapacityLimit
from app.api.form_bytes import StrictForms
from app.api.routes import (
    errata,
    fields,
    health,
    notebooks,
    placements,
    replays,
    runs,
    shares,
    skills,
    sweeps,
    trajectories,
)
from app.gateway import routes as gateway_routes
from app.gateway.main import lifespan as gateway_lifespan
from app.security.guard import authorize
from app.security.middleware import SecurityMiddleware
from data.lifeline import die_with_parent
from data.settings import get_settings
from data.signing import ensure_secret_key

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def _has_module(name: str) -> bool:
    parent = name.rpartition(".")[0]
    return (not parent or _has_module(parent)) and importlib.util.find_spec(name) is not None


def create_app() -> FastAPI:
    die_with_parent(get_settings().supervisor_pid)  # a web process of `kvnotes serve` dies with it
    ensure_secret_key()
    app = FastAPI(
        title="kvnotes",
        summary="Edit and compose a language model's KV cache (its notes) "
                "instead of paying for prefill again.",
        version="0.1.0",
        dependencies=[Depends(authorize)],
        docs_url=None,
        redoc_url=None,
        lifespan=gateway_lifespan,  # the gateway's pools and state connections closed at shutdown
    )
    api = APIRouter(prefix="/api")
    for module in (notebooks, fields, errata, skills, placements, runs, replays, shares, health, sweeps,
                   trajectories):
        api.include_router(module.router)
    app.include_router(api)
    # the erratum gateway, behind the same accounts and tokens (`app.gateway`); its API is OpenAI's,
    # documented there, not in this app's schema
    app.include_router(gateway_routes.router, prefix="/gateway/v1", include_in_schema=False)
    app.include_router(gateway_routes.metrics_router, prefix="/gateway", include_in_schema=False)
    refusals.install(app)  # the rules the schema cannot state, 409 and 503, described
    handlers.install(app)
    app.add_middleware(StrictForms)  # every form field UTF-8 before any handler reads it
    app.add_middleware(CapacityLimit)  # inside the security checks: a refused request takes no slot
    app.add_middleware(SecurityMiddleware)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    if _has_module("app.web.router"):
        app.include_router(importlib.import_module("app.web.router").router)
    return app


def __getattr__(name: str) -> FastAPI:
    """`app.main:app`, made when a server first asks for it (uvicorn's import string), not on import:
    importing this module writes nothing (no key file, no database) and reads no model."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = create_app()
    globals()["app"] = made
    return made
