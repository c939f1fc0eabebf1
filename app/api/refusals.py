"""What the OpenAPI schema says beyond the routes' own `responses=`: the refusals JSON Schema cannot
state, and the answers any route of a kind may give.

- `RULES`: per operation, the rules a schema-valid request can still break (a field's start before
  its end, a skill compiled before it is placed, errata reordered by listing each exactly once, a
  notebook's question set before a run without one, a vLLM server to replay on). Each is a 422
  shaped like a validation error; the schema lists them under the operation's 422 and as
  `x-refusals`, which the fuzz test reads (tests/api/test_fuzz.py) so a 422 is expected of those
  operations only, never elsewhere.
- Every operation that changes something may answer 409 (two requests changed the same rows at
  once; `app.api.handlers`) and 503 (the database cannot be written, or no connection came free).

`install(app)` adds these to the schema when it is made; an operation named here that no route
serves makes that fail, so the list cannot drift from the routes (tests/api/test_fuzz.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

SPAN = "a field is a non-empty span inside the document: 0 <= start < end <= its length"
RULES: dict[str, list[str]] = {
    "PATCH /api/notebooks/{notebook_id}": [
        "a new text keeps every field and placement inside it",
        "a new model has every placed skill compiled for it"],
    "POST /api/notebooks/{notebook_id}/fields": [SPAN, "at most KVNOTES_MAX_FIELDS fields"],
    "PATCH /api/fields/{field_id}": [SPAN],
    "POST /api/notebooks/{notebook_id}/errata": ["at most KVNOTES_MAX_ERRATA errata"],
    "POST /api/notebooks/{notebook_id}/errata/order": ["ids list this notebook's errata, each exactly once"],
    "POST /api/notebooks/{notebook_id}/placements": [
        "the skill exists and is compiled for the notebook's model", "position is inside the document",
        "at most KVNOTES_MAX_PLACEMENTS placements"],
    "PATCH /api/placements/{placement_id}": ["position is inside the document"],
    "POST /api/notebooks/{notebook_id}/runs": ["the notebook has a question, or the run sends one"],
    "GET /api/runs/{run_id}/attention": [
        "the strategy ran; layer and head exist; query is a question or answer token the run kept"],
    "POST /api/notebooks/{notebook_id}/sweeps": [
        'the edits given one way: "values" and/or "generate", or "edits"',
        "every label names a field of the notebook",
        "at most KVNOTES_MAX_SWEEP_EDITS edits (generated ones included)",
        "the notebook has a question, or the sweep sends one",
        "every value among the choices where they name the field's values, unless extend_choices",
        "a generator's range is neither empty nor reversed, parses as its kind and holds count distinct "
        "values"],
    "POST /api/sweeps/{sweep_id}/adopt": [
        "the sweep has finished, with at least one finished edit, and its notebook still exists"],
    "POST /api/notebooks/{notebook_id}/replays": [
        "a vLLM server the operator configured (KVNOTES_VLLM_URL), reachable and serving the model",
        "the notebook has a field (field_id: one of its fields) and a question",
        "the load is sensible: at least one value, known variants"],
    "POST /api/trajectories/{trajectory_id}/replays": [
        "a vLLM server the operator configured (KVNOTES_VLLM_URL), reachable and serving the model",
        "known variants; the trajectory's turns can be sent (none empty, every field a turn changes exists)"],
    "POST /api/notebooks/{notebook_id}/trajectories": [
        "at most KVNOTES_MAX_TURNS turns, none empty",
        "every label a turn changes names a field of the notebook",
        "a question for every turn (the turn's, the request's or the notebook's)",
        "strategies carried across turns (a strategy that appends errata also as name.one_per_field)",
        "every turn's prompt fits the model's context (counted where the web can read the model's files; "
        "else the worker fails the trajectory before its first turn)"],
}
CHANGES = {"POST", "PUT", "PATCH", "DELETE"}


def install(app: FastAPI) -> None:
    """Describe `RULES`, 409 and 503 in the app's schema (`app.openapi`, made once, then cached)."""
    made = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            describe(made())
        return app.openapi_schema or made()

    app.openapi = openapi  # type: ignore[method-assign]


def describe(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (an OpenAPI document) with `RULES`, 409 and 503 added to its API operations."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
    seen: set[str] = set()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            name = f"{method.upper()} {path}"
            responses = operation.setdefault("responses", {})
            if method.upper() in CHANGES and path.startswith("/api/"):
                responses.setdefault("409", {"description": "Conflict: another request changed or deleted "
                                             "the same rows at once", "content": error})
                responses.setdefault("503", {"description": "The database cannot be written right now, or "
                                             "the server is busy (Retry-After)", "content": error})
            if name in RULES:
                seen.add(name)
                operation["x-refusals"] = RULES[name]
                responses.setdefault("422", {})["description"] = (
                    "Validation Error, or one of these rules broken: " + "; ".join(RULES[name]))
    unknown = sorted(set(RULES) - seen)
    if unknown:
        raise RuntimeError(f"app.api.refusals names operations no route serves: {', '.join(unknown)}")
    return schema
