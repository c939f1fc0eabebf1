"""Error pages in the app's layout: a page route that answers 404, 422, 500 (or any other error)
shows what went wrong in words, with the way back, inside the usual header and footer. The JSON
API keeps its JSON (`app.api.handlers.answer` decides which face a request gets)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from app.web.templating import render

TITLES = {
    400: "Bad request", 401: "Sign in", 403: "Not allowed", 404: "Not found", 405: "Not allowed here",
    409: "Changed meanwhile", 413: "Too large", 422: "That request cannot be used", 429: "Too many runs",
    500: "Something went wrong", 503: "Not available right now",
}


def error_page(request: Request, status: int, message: str,
               headers: dict[str, str] | None = None, title: str | None = None) -> Response:
    response = render(request, "error.html", status, status=status,
                      title=title or TITLES.get(status, "Error"), message=message)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def validation_message(errors: Sequence[dict[str, Any]]) -> str:
    """FastAPI's validation errors in one line a person can act on: which parameter, what is wrong,
    and a short quote of what was sent."""
    parts = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ()) if p not in ("query", "path", "body", "form")]
        name = ".".join(loc) or "the request"
        text = str(error.get("msg", "is not valid")).removeprefix("Value error, ")
        sent = error.get("input")
        quote = f" (got “{str(sent)[:40]}”)" if isinstance(sent, str | int | float) else ""
        parts.append(f"{name}: {text}{quote}")
    return "; ".join(parts) or "the request is not valid"
