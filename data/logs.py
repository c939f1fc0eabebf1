"""Structured logs: one `key=value` line per record, with the record's `extra` fields included.

`kvnotes serve` (the web app and uvicorn), the worker (Celery's `setup_logging` signal) and the
command line call `configure_logging`; code logs its facts as `extra=` and they reach the line:

    ts=2026-12-01T12:00:00.123Z level=WARNING logger=data.queue msg="enqueue failed" task=kvnotes.run
    queue=model.smollm2-135m reason="OperationalError: …"

Values with spaces, quotes or `=` are quoted (JSON string escapes); an exception's traceback goes in
`exc` on the same line, so one record is always one line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

# the attributes every LogRecord has; anything else on a record came from `extra=`
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


def _value(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if text and not any(ch.isspace() or ch in '"=\\' for ch in text) and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


def facts(record: logging.LogRecord) -> dict[str, object]:
    """The `extra=` fields of a record, in the order they were given."""
    return {key: value for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")}


class KeyValueFormatter(logging.Formatter):
    """`ts=… level=… logger=… msg=…` then every `extra` field, then `exc=…` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        pairs = {"ts": moment.replace("+00:00", "Z"), "level": record.levelname, "logger": record.name,
                 "msg": record.getMessage(), **facts(record)}
        if record.exc_info:
            pairs["exc"] = self.formatException(record.exc_info)
        return " ".join(f"{key}={_value(value)}" for key, value in pairs.items())


def configure_logging(level: int | str = logging.INFO) -> None:
    """Every record of this process, at `level` and above, as one key=value line on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


__all__ = ["KeyValueFormatter", "configure_logging", "facts"]
