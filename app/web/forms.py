"""Form handling shared by the pages: validate form data with the API's own pydantic schemas
(one set of limits and messages for JSON and HTML). Every failure is an `Unprocessable` whose
`errors` ({field: message}) the page shows next to each field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from app.services.errors import Unprocessable
from data.settings import get_settings

M = TypeVar("M", bound=BaseModel)


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
    """`schema(**data)`, or `Unprocessable` naming each bad field (with `rename` mapping schema →
    form names)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise Unprocessable.of(errors_of(exc, rename)) from None


def parse_int(value: Any, name: str) -> int | None:
    """'' → None; digits → int; anything else is an error naming the field."""
    if value is None or str(value).strip() == "":
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise Unprocessable(name, f"{name} must be a whole number; got {str(value)[:40]!r}") from None


def parse_number(value: Any, name: str, default: float) -> float:
    """'' → `default`; a decimal number → float; anything else is an error naming the field (the
    API's numbers are JSON numbers, never text, so a form's text is read here)."""
    if value is None or str(value).strip() == "":
        return default
    try:
        return float(str(value).strip())
    except ValueError:
        raise Unprocessable(name, f"{name} must be a number; got {str(value)[:40]!r}") from None


def lines(value: str | None) -> list[str]:
    """A textarea of one item per line → the non-empty, stripped items."""
    return [line.strip() for line in (value or "").splitlines() if line.strip()]


async def upload_text(file: UploadFile, field: str, prefix: str = "") -> str:
    """The text of an uploaded file, by the text rules' first one: at most `KVNOTES_MAX_UPLOAD_BYTES`,
    and UTF-8 (a leading BOM dropped). A file that is not is refused naming the first bad byte, never
    read with U+FFFD in place of its bytes. `Unprocessable` on `field`, its message after `prefix`."""
    limit = get_settings().max_upload_bytes
    raw = await file.read(limit + 1)
    if len(raw) > limit:
        raise Unprocessable(field, f"{prefix}the file is larger than {limit} bytes "
                                   "(KVNOTES_MAX_UPLOAD_BYTES)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        name = file.filename or "the file"
        raise Unprocessable(field, f"{prefix}{name} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                                   f"offset {exc.start}): save it as UTF-8") from None
