"""schemathesis against the real server's /openapi.json: thousands of generated requests (bad ids,
huge numbers, odd Unicode, missing and extra fields, stateful sequences), not one 5xx, and the
schema describes what the app answers: status codes, content types, response bodies, `Allow` on
405, schema-invalid input refused, schema-valid input accepted, a created resource found where its
links say.

Every check runs. The rules JSON Schema cannot state (a field's start before its end, a skill
compiled before it is placed, errata reordered by listing each exactly once, a notebook's question
set before a run without one, a vLLM server to replay on) are listed by the schema itself, per
operation, as `x-refusals` (`app.api.refusals`): the 422 they answer is expected of those
operations only (a schemathesis config written from the schema), and anywhere else a schema-valid
request refused fails the test. A boolean in place of a number is tried for every number of every
request body on purpose (`test_a_boolean_is_never_a_number_in_any_request_body`), not left to the
generator's luck.

The server is uvicorn on a free port with the embedded database and broker and no worker: runs
queue until the run caps answer 429, which is what keeps the fuzzing bounded. `/api/health` is
left out: with no worker its documented answer is 503. Bounded by `FUZZ_SECONDS`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServedApp, missing

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FUZZ_SECONDS = 150
CHECKS = ("not_a_server_error,positive_data_acceptance,status_code_conformance,content_type_conformance,"
          "response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method,"
          "allow_header_conformance,use_after_free,ensure_resource_availability")


def _refusals_config(spec: dict) -> str:
    """A schemathesis config expecting a 422 (besides its defaults) of the operations whose
    schema lists `x-refusals`, and of no other."""
    expected = '["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]'
    blocks = [f'[[operations]]\ninclude-name = "{method.upper()} {path}"\n'
              f"checks.positive_data_acceptance.expected-statuses = {expected}\n"
              for path, operations in spec["paths"].items() for method, operation in operations.items()
              if operation.get("x-refusals")]
    assert len(blocks) >= 10, blocks
    return "\n".join(blocks)


def test_no_generated_request_gets_a_server_error_and_the_schema_holds(tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    if st is None:
        missing("schemathesis is not installed (pip install -e '.[test]')")
    with ServedApp(tmp_path, KVNOTES_BROKER_TIMEOUT="1") as app:
        spec = httpx.get(f"{app.url}/openapi.json", timeout=30)
        for _ in range(60):  # the port opens before the app answers, on a loaded machine (503 then)
            if spec.status_code == 200:
                break
            time.sleep(0.5)
            spec = httpx.get(f"{app.url}/openapi.json", timeout=30)
        assert spec.status_code == 200, spec.text
        config = _refusals_config(spec.json())
        (tmp_path / "schemathesis.toml").write_text(config)
        done = subprocess.run(
            [st, "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{app.url}/openapi.json",
             "--checks", CHECKS,
             "--exclude-path", "/api/health", "--max-examples", "15", "--generation-database", "none",
             "--workers", "1", "--max-time", str(FUZZ_SECONDS),
             "--seed", os.environ.get("KVNOTES_FUZZ_SEED", "20261130")],  # another seed: set it
            capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
        report = done.stdout[-6000:]
        assert "Server error" not in done.stdout, report
        assert done.returncode == 0 and "unique failures" not in done.stdout, report
        generated = [line for line in done.stdout.splitlines() if "generated" in line]
        print("\n" + (generated[-1].strip() if generated else report[-500:]))
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def _number_fields(spec: dict, schema: dict, path: tuple = ()) -> list[tuple[tuple, str]]:
    """(where in the body, "integer" or "number") for every number the body schema declares."""
    if "$ref" in schema:
        return _number_fields(spec, spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], path)
    found = []
    for option in schema.get("anyOf", []) + schema.get("allOf", []):
        found += _number_fields(spec, option, path)
    if schema.get("type") in ("integer", "number"):
        found.append((path, schema["type"]))
    if schema.get("type") == "array" and "items" in schema:
        found += _number_fields(spec, schema["items"], (*path, 0))
    for name, prop in schema.get("properties", {}).items():
        found += _number_fields(spec, prop, (*path, name))
    return found


def _with_false(where: tuple) -> object:
    """A body whose value at `where` is `false` ((“ids”, 0) → {"ids": [false]})."""
    value: object = False
    for part in reversed(where):
        value = [value] if isinstance(part, int) else {part: value}
    return value


def test_a_boolean_is_never_a_number_in_any_request_body(make_client) -> None:
    """On purpose, not by luck: for every integer and number of every JSON request body in the
    schema, `false` in its place is a 422 naming that field as not a number (it was read as 0)."""
    client = make_client()
    spec = client.get("/openapi.json").json()
    checked, wrong = [], []
    for route, operations in spec["paths"].items():
        for method, operation in operations.items():
            body = (operation.get("requestBody") or {}).get("content", {}).get("application/json")
            if body is None:
                continue
            for where, kind in _number_fields(spec, body["schema"]):
                url = route.replace("{", "").replace("}", "")  # every id "1": validation comes first
                url = "/".join("1" if part.endswith("_id") else part for part in url.split("/"))
                r = client.request(method, url, json=_with_false(where))
                errors = r.json()["detail"] if r.status_code == 422 else []
                named = [e for e in errors if tuple(e["loc"][1:]) == where]
                if not (named and named[0]["type"] in ("int_type", "float_type")):
                    wrong.append((method, route, where, r.status_code, r.text[:300]))
                checked.append((method.upper(), route, where, kind))
    print(f"\n{len(checked)} numbers checked: " + ", ".join(f"{m} {r} {'.'.join(map(str, w))}"
                                                         for m, r, w, _ in checked))
    assert not wrong, wrong
    names = {(m, w) for m, _, w, _ in checked}
    assert len(checked) >= 13, checked
    assert {("POST", ("start",)), ("PATCH", ("end",)), ("POST", ("ids", 0)), ("POST", ("skill_id",)),
            ("POST", ("rate",)), ("POST", ("max_tokens",))} <= names, names
