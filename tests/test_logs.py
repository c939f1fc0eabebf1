"""Logs carry their facts as fields: every log call in app/, data/, worker/ and serving/ gives a
constant message and passes run ids, models, durations and reasons as `extra=` fields, which
`data.logs.KeyValueFormatter` writes as `key=value` (so a log reader filters on `run_id=12`
instead of parsing prose). A call that formats a fact into its message (%-arguments, an f-string,
`%` or `.format`) fails here, naming its file and line."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "data", "worker", "serving")
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _log_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in LEVELS and isinstance(node.func.value, ast.Name)
                        and "log" in node.func.value.id.lower()):
                    calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return calls


def _formats_facts(call: ast.Call) -> str | None:
    """Why this call puts facts in its message, or None."""
    if not call.args:
        return "no message"
    if len(call.args) > 1:
        return f"{len(call.args) - 1} %-argument(s)"
    message = call.args[0]
    if isinstance(message, ast.JoinedStr):
        return "an f-string"
    if isinstance(message, ast.BinOp):
        return "a message built with an operator"
    if not (isinstance(message, ast.Constant) and isinstance(message.value, str)):
        return "a message that is not a constant string"
    if "%" in message.value.replace("%%", ""):
        return "a %-placeholder"
    return None


def test_no_log_call_formats_its_facts_into_the_message() -> None:
    calls = _log_calls()
    assert len(calls) >= 40  # the scan sees the code (45 calls when this test was written)
    offending = [f"{where}: {why}" for where, call in calls if (why := _formats_facts(call))]
    assert offending == []
    with_fields = [where for where, call in calls if any(k.arg == "extra" for k in call.keywords)]
    assert len(with_fields) >= 35  # facts travel as fields


def test_the_scan_catches_each_way_of_formatting_facts() -> None:
    bad = ['log.info("run %s succeeded", run_id)', 'log.info(f"run {run_id} succeeded")',
           'log.info("run %s" % run_id)', 'log.info("run {}".format(run_id))', 'log.info(str(exc))']
    good = 'log.info("run succeeded", extra={"run_id": run_id})'
    for source in bad:
        assert _formats_facts(ast.parse(source).body[0].value) is not None, source
    assert _formats_facts(ast.parse(good).body[0].value) is None


def test_fields_reach_the_line() -> None:
    from data.logs import KeyValueFormatter

    record = logging.LogRecord("worker.tasks", logging.INFO, __file__, 1, "run succeeded", None, None)
    record.run_id, record.duration_ms = 12, 834
    line = KeyValueFormatter().format(record)
    assert line.endswith('msg="run succeeded" run_id=12 duration_ms=834'), line
