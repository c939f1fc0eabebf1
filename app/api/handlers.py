"""How errors are answered, in one place: the JSON API gets `{"detail": …}`, an htmx request a
small alert fragment, a page an error page in the app's layout (`app.web.errors`); unknown
paths and 404s raised by routes likewise (`.json` routes answer JSON), and an unexpected error is
a 500 in the same two faces. Every message is one line a person can act on.

- 422 (validation): FastAPI's shape, but the input is quoted as a short prefix only (a 10 MB field
  is never echoed back) and text that is not valid Unicode is escaped, never a 500. A body that
  cannot be read at all (bytes that are not UTF-8) is a 422 too, not FastAPI's bare 400.
- 503: the database could not be written (read-only, full disk, gone): a plain message, no SQL;
  the request's session was rolled back, so nothing of it is saved.
- 503 busy: no database connection came free in time (the request limiter, `app.api.capacity`,
  normally answers this before a request waits for the pool).
- 409: two requests changed the same rows at once (e.g. two deletes in one notebook).
- 404: what an action works on was deleted meanwhile (`Gone`: a field whose notebook went).
- 405: `Allow` lists every method of every route at the path (Starlette names one route's only).
- 429 / 503 / sign-in: the run caps, too many sign-ins at once, and pages that need a signed-in user.
"""

from __future__ import annotations

import html
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm.exc import ObjectDeletedError, StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.api.capacity import BUSY, RETRY_AFTER_S
from app.security.guard import SignInRequired, login_url
from app.services.errors import Gone, RunLimitReached, Unprocessable
from app.web.errors import error_page, validation_message
from data.health import plain_database_error

log = logging.getLogger(__name__)
QUOTE_CHARS = 60  # how much of a bad input a 422 quotes back


def safe_text(value: str, limit: int = QUOTE_CHARS) -> str:
    """At most `limit` characters of `value`, lone surrogates escaped (JSON must stay UTF-8)."""
    cut = value[:limit] + ("…" if len(value) > limit else "")
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def _quoted(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, bool | int | float) or value is None:
        return value if not isinstance(value, int) or abs(value) < 10**18 else safe_text(str(value))
    return f"<{type(value).__name__}>"


def wants_json(request: Request) -> bool:
    """The JSON API, a `.json` page route (exports, token spans), a page route that answers JSON
    (declared with `response_class=JSONResponse`: the run page's painted views), or a client that
    asks for JSON."""
    path = request.url.path
    route_class = getattr(request.scope.get("route"), "response_class", None)
    return (path.startswith("/api/") or path == "/api" or path.endswith(".json")
            or route_class is JSONResponse or "application/json" in request.headers.get("accept", ""))


def answer(request: Request, status: int, message: str, headers: dict[str, str] | None = None,
           title: str | None = None) -> Response:
    """`message` as JSON for the API, an alert fragment for htmx, a page in the app's layout otherwise
    (titled `title`, else by its status)."""
    if wants_json(request):
        return JSONResponse({"detail": message}, status_code=status, headers=headers)
    if request.headers.get("HX-Request") == "true":
        alert = f'<div class="form-error" role="alert">{html.escape(message)}</div>'
        return HTMLResponse(alert, status, headers)
    return error_page(request, status, message, headers, title)


BODY_PARSE_ERROR = "There was an error parsing the body"  # FastAPI's 400 for a body it cannot decode


def _unreadable_body(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's 400 for a body it could not decode, as the 422 it is (same shape as a bad field)."""
    cause = exc.__cause__
    message = (f"the body is not valid UTF-8 (at byte offset {cause.start})"
               if isinstance(cause, UnicodeDecodeError) else "the body could not be read as JSON or a form")
    if not wants_json(request) and request.headers.get("HX-Request") != "true":
        return error_page(request, 422, message)
    detail = [{"loc": ["body"], "msg": message, "type": "json_invalid"}]
    return JSONResponse(status_code=422, content={"detail": detail})


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method some route answers at this path (Starlette's 405 names only the first route's)."""
    routes = request.app.router.routes
    def answers(method: str) -> bool:
        return any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)

    return ", ".join(method for method in HTTP_METHODS if answers(method))


async def _http(request: Request, exc: Exception) -> Response:
    """404s, 409s… raised by routes (and unknown paths): JSON for the API, a page for the pages."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == BODY_PARSE_ERROR:
        return _unreadable_body(request, exc)
    if exc.status_code == 405:
        exc.headers = {**(exc.headers or {}), "Allow": allowed_methods(request)}
    if not isinstance(exc.detail, str):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    return answer(request, exc.status_code, exc.detail, exc.headers, getattr(exc, "title", None))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unexpected error answering a request", exc_info=exc,
              extra={"method": request.method, "path": request.url.path})
    return answer(request, 500,
                  "the server could not answer this request (an unexpected error, logged on the server)")


async def _validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    if not wants_json(request) and request.headers.get("HX-Request") != "true":  # a page: 422 in the layout
        return error_page(request, 422, validation_message(exc.errors()))
    detail = []
    for error in exc.errors():
        item = {"loc": [_quoted(part) for part in error.get("loc", ())],
                "msg": safe_text(str(error.get("msg", "")), 300),
                "type": error.get("type", "value_error")}
        if "input" in error:
            item["input"] = _quoted(error["input"])
        detail.append(item)
    return JSONResponse(status_code=422, content={"detail": detail})


async def _unprocessable(_request: Request, exc: Exception) -> JSONResponse:
    """Same shape as FastAPI's validation errors: the field to blame and what is wrong."""
    assert isinstance(exc, Unprocessable)
    detail = [{"loc": ["body", field], "msg": safe_text(message, 500), "type": "value_error"}
              for field, message in exc.errors.items()]
    return JSONResponse(status_code=422, content={"detail": detail})


def _refers_to_a_deleted_row(exc: BaseException) -> bool:
    """A foreign-key violation: the row a write refers to (a field's notebook) was deleted under the
    request (PostgreSQL's SQLSTATE 23503, SQLite's "FOREIGN KEY constraint failed")."""
    if not isinstance(exc, IntegrityError):
        return False
    inner = exc.orig
    return getattr(inner, "sqlstate", None) == "23503" or "FOREIGN KEY constraint failed" in str(inner)


async def _database(request: Request, exc: Exception) -> Response:
    if _refers_to_a_deleted_row(exc):  # issue 49: a row gone under a request is a 404, not a 503
        return answer(request, 404, "what this request refers to was deleted meanwhile; nothing was saved",
                      title="Deleted")
    reason = plain_database_error(exc)
    log.error("database error answered 503", extra={"reason": reason})
    return answer(request, 503, f"the database cannot be written right now ({reason}); nothing was saved",
                  {"Retry-After": "30"})


async def _pool_timeout(request: Request, _exc: Exception) -> Response:
    return answer(request, 503, BUSY, {"Retry-After": str(RETRY_AFTER_S)})


async def _stale(request: Request, _exc: Exception) -> Response:
    return answer(request, 409,
                  "another request changed or deleted this at the same time; reload and try again")


async def _gone(request: Request, exc: Exception) -> Response:
    return answer(request, 404, str(exc), title="Deleted")


async def _row_deleted(request: Request, _exc: Exception) -> Response:
    """A row read before, deleted by another request before this one read it again."""
    return answer(request, 404, "what this request works on was deleted meanwhile; nothing was saved",
                  title="Deleted")


async def _run_limit(request: Request, exc: Exception) -> Response:
    return answer(request, 429, str(exc), {"Retry-After": "30"})


async def _sign_in(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SignInRequired)
    target = login_url(exc.next_path)
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=401, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


def install(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _server_error)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(Unprocessable, _unprocessable)
    app.add_exception_handler(DBAPIError, _database)
    app.add_exception_handler(PoolTimeout, _pool_timeout)
    app.add_exception_handler(StaleDataError, _stale)
    app.add_exception_handler(Gone, _gone)
    app.add_exception_handler(ObjectDeletedError, _row_deleted)
    app.add_exception_handler(RunLimitReached, _run_limit)
    app.add_exception_handler(SignInRequired, _sign_in)
