"""Form handling shared by the pages: validate form data with the API's own pydantic schemas
(one set of limits and messages for JSON and HTML), and turn failures into `{field: message}`
so each message can be shown next to its field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app.services.notebooks import Unprocessable

M = TypeVar("M", bound=BaseModel)


class FormErrors(Exception):
    """A form that failed; `errors` maps form field names to the server's message."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def errors_of(exc: ValidationError, rename: dict[str, str] | None = None) -> dict[str, str]:
    """pydantic errors → {field: message}; the first message per field wins."""
    rename = rename or {}
    out: dict[str, str] = {}
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ()) if not isinstance(part, int)]
        name = rename.get(loc[0], loc[0]) if loc else "form"
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        out.setdefault(name, message)
    return out


def validate(schema: type[M], data: dict[str, Any], rename: dict[str, str] | None = None) -> M:
    """`schema(**data)` or FormErrors naming each bad field (with `rename` mapping schema → form names)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise FormErrors(errors_of(exc, rename)) from None


def unprocessable_errors(exc: Unprocessable, rename: dict[str, str] | None = None) -> dict[str, str]:
    return {(rename or {}).get(exc.field, exc.field): exc.message}


def parse_int(value: Any, name: str) -> int | None:
    """'' → None; digits → int; anything else is an error naming the field."""
    if value is None or str(value).strip() == "":
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise FormErrors({name: f"{name} must be a whole number; got {str(value)[:40]!r}"}) from None


def lines(value: str | None) -> list[str]:
    """A textarea of one item per line → the non-empty, stripped items."""
    return [line.strip() for line in (value or "").splitlines() if line.strip()]


def normalize_newlines(text: str) -> str:
    """CRLF / CR → LF (browsers submit textareas with CRLF; the HTML parser drops CR when it draws)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")
