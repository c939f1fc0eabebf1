"""Forms are read strictly as UTF-8, as JSON bodies are: the first of the text rules
(`vocabulary.text_rules`) holds for every form field before any handler sees it.

Starlette decodes form fields leniently: an urlencoded `title=%ED%A0%80` reads as "\\ufffd\\ufffd\\ufffd"
and a multipart field that is not UTF-8 is read as Latin-1 ("í\\xa0\\x80"). Both pass every later
rule (U+FFFD and "í" show), so the bytes a client sent would be saved as something else. This ASGI
middleware reads a form body (bounded by `app.security.middleware`'s request limit) before the app
does, checks every field name and value (a multipart file's name too; a file's content is checked by
`app.web.forms.upload_text`, which every upload is read through) and answers 422 naming the first
field that is not UTF-8, in the request's face (`app.api.handlers.answer`); a body that passes is
handed on unchanged.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi.responses import JSONResponse
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.handlers import answer, wants_json

URLENCODED = b"application/x-www-form-urlencoded"
MULTIPART = b"multipart/form-data"
_PAIRS = re.compile(rb"[&;]")  # the separators python-multipart's query-string parser splits on


class NotUtf8(ValueError):
    """A form field whose name or value is not UTF-8: `field` (its name as far as it reads), `message`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _decoded(raw: bytes, field: str, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(field, f"{field}: {what} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                             f"{exc.start}); send text as UTF-8") from None


def _readable(raw: bytes) -> str:
    """A field name for a message, whatever its bytes (bad ones escaped)."""
    return raw.decode("utf-8", "backslashreplace")[:80] or "(unnamed field)"


def check_urlencoded(body: bytes) -> None:
    """`NotUtf8` for the first name or value of an urlencoded body that is not UTF-8 once unquoted."""
    for pair in _PAIRS.split(body):
        if not pair:
            continue
        raw_name, _, raw_value = pair.partition(b"=")
        name = unquote_to_bytes(raw_name.replace(b"+", b" "))
        field = _decoded(name, _readable(name), "the field's name")
        _decoded(unquote_to_bytes(raw_value.replace(b"+", b" ")), field, "the value")


def check_multipart(body: bytes, boundary: bytes) -> None:
    """`NotUtf8` for the first part of a multipart body whose name (or file name) or, for a field
    that is not a file, whose value is not UTF-8."""
    parts: list[dict[str, Any]] = []
    header: dict[str, bytes] = {"field": b"", "value": b""}

    def on_part_begin() -> None:
        parts.append({"headers": {}, "data": bytearray()})

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header["value"] += data[start:end]

    def on_header_end() -> None:
        parts[-1]["headers"][header["field"].lower()] = header["value"]
        header["field"], header["value"] = b"", b""

    def on_headers_finished() -> None:
        _, options = parse_options_header(parts[-1]["headers"].get(b"content-disposition", b""))
        parts[-1]["options"] = options

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if b"filename" not in parts[-1]["options"]:  # a file's bytes are `upload_text`'s to check
            parts[-1]["data"] += data[start:end]

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                                        "on_header_value": on_header_value, "on_header_end": on_header_end,
                                        "on_headers_finished": on_headers_finished,
                                        "on_part_data": on_part_data})
    try:
        parser.write(body)
        parser.finalize()
    except Exception:  # noqa: BLE001 - a malformed body is Starlette's to refuse (its 400, our 422)
        return
    for part in parts:
        options = part.get("options", {})
        raw_name = options.get(b"name", b"")
        field = _decoded(raw_name, _readable(raw_name), "the field's name")
        if b"filename" in options:
            _decoded(options[b"filename"], field, "the file's name")
        else:
            _decoded(bytes(part["data"]), field, "the value")


def check_form(content_type: str, body: bytes) -> None:
    """`NotUtf8` when a form body of `content_type` holds a name or value that is not UTF-8."""
    kind, options = parse_options_header(content_type)
    if kind == URLENCODED:
        check_urlencoded(body)
    elif kind == MULTIPART and options.get(b"boundary"):
        check_multipart(body, options[b"boundary"])


class StrictForms:
    """Pure ASGI middleware: a form body with a field that is not UTF-8 gets 422 naming the field."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
        if not content_type.lower().startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            return await self.app(scope, receive, send)
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        try:
            check_form(content_type, b"".join(m.get("body", b"") for m in messages))
        except NotUtf8 as exc:
            request = Request(scope)
            response = (JSONResponse({"detail": [{"loc": ["body", exc.field], "msg": str(exc),
                                                  "type": "unicode_decode"}]}, 422)
                        if wants_json(request) else answer(request, 422, str(exc)))
            return await response(scope, receive, send)

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
