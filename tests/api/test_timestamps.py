"""Every timestamp the API returns carries its time zone (issue 41: `GET /api/sweeps/{id}` gave
`created_at` as "2026-12-04T10:26:16.796848", against its schema's `date-time`).

Over the OpenAPI schema: every property of format `date-time` belongs to a model the routes
return, and that field, given the naive datetime SQLite hands back, answers it with its zone
(`app.schema_types.Timestamp`). A model added later with a bare `datetime` fails here."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, get_args, get_origin

from pydantic import BaseModel, create_model


def _date_times(components: dict[str, Any]) -> set[tuple[str, str]]:
    """(component, property) for every property of format `date-time` (or null) in the schemas."""
    def is_date_time(sub: dict) -> bool:
        return any(s.get("format") == "date-time" for s in [sub, *sub.get("anyOf", [])])
    return {(component, name) for component, body in components.get("schemas", {}).items()
            for name, sub in (body.get("properties") or {}).items() if is_date_time(sub)}


def _models(annotation: Any, seen: dict[str, type[BaseModel]]) -> None:
    """Every pydantic model reachable from `annotation`, by name."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation.__name__ in seen:
            return
        seen[annotation.__name__] = annotation
        for field in annotation.model_fields.values():
            _models(field.annotation, seen)
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        _models(arg, seen)


def test_every_date_time_of_the_schema_is_answered_with_its_time_zone(make_client) -> None:
    client = make_client()
    schema = client.get("/openapi.json").json()
    found = _date_times(schema.get("components", {}))
    assert len(found) >= 10  # notebooks, fields, errata, skills, runs, sweeps, trajectories, replays…
    models: dict[str, type[BaseModel]] = {}
    for route in _api_routes(client.app):
        _models(getattr(route, "response_model", None), models)
    naive = datetime(2026, 12, 4, 10, 26, 16, 796848)  # what SQLite gives back: no zone
    missing, bare = [], []
    for component, name in sorted(found):
        # a name two models share is written with its module: app__api__routes__shares__ShareOut
        model = models.get(component.removesuffix("-Output").removesuffix("-Input").rsplit("__", 1)[-1])
        if model is None:
            missing.append(component)
            continue
        probe = create_model("Probe", value=(model.model_fields[name].annotation, model.model_fields[name]))
        answered = json.loads(probe(value=naive).model_dump_json())["value"]
        if not answered.endswith(("Z", "+00:00")):
            bare.append(f"{component}.{name}: {answered}")
    assert missing == [] and bare == []


def _api_routes(app) -> list:
    """The API's routes, included routers walked."""
    def walk(routes):
        for route in routes:
            if hasattr(route, "original_router"):
                yield from walk(route.original_router.routes)
            else:
                yield route
    return list(walk(app.router.routes))


def test_a_sweep_is_answered_with_its_time_zone(make_client) -> None:
    """The case the issue found, end to end: a sweep's `created_at` from `GET /api/sweeps/{id}`."""
    client = make_client()
    text = "Customer record. status: active. age: 34. Only active customers may log in."
    nb = client.post("/api/notebooks", json={"title": "policy", "model": "smollm2-135m", "text": text}).json()
    at = text.index("active")
    field = client.post(f"/api/notebooks/{nb['id']}/fields",
                        json={"start": at, "end": at + 6, "new_value": "suspended", "label": "status"})
    assert field.status_code == 201, field.text
    r = client.post(f"/api/notebooks/{nb['id']}/sweeps",
                    json={"question": "Can the customer log in?", "values": {"status": ["paused"]}})
    assert r.status_code in (201, 202), r.text
    sweep = client.get(f"/api/sweeps/{r.json()['id']}").json()
    assert sweep["created_at"].endswith(("Z", "+00:00")), sweep["created_at"]
