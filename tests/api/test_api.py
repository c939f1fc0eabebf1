"""The HTTP JSON API against a temporary SQLite database and a REAL broker (the embedded
SQLAlchemy broker on SQLite): enqueuing leaves a message in the broker's database; an unreachable
broker answers 503 and saves nothing; limits answer 422 naming the field and the limit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import DOC, _broker_messages, _notebook  # noqa: F401
from vocabulary import STRATEGIES as ALL_STRATEGIES

STRATEGIES = list(ALL_STRATEGIES)


def _field(
    client: TestClient, nb: int, old: str = "active", new: str = "suspended", label: str = "status"
) -> dict:
    start = DOC.index(old)
    r = client.post(
        f"/api/notebooks/{nb}/fields",
        json={"start": start, "end": start + len(old), "new_value": new, "label": label},
    )
    assert r.status_code == 201, r.text
    return r.json()


def _run_count(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "kvnotes.db") as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0]


def test_notebook_crud_and_404(make_client) -> None:
    client = make_client()
    nb = _notebook(client)
    assert nb["text"] == DOC and nb["model"] == "smollm2-135m" and nb["fields"] == []
    assert [n["id"] for n in client.get("/api/notebooks").json()] == [nb["id"]]
    r = client.patch(f"/api/notebooks/{nb['id']}", json={"title": "renamed"})
    assert r.status_code == 200 and r.json()["title"] == "renamed" and r.json()["text"] == DOC
    assert client.delete(f"/api/notebooks/{nb['id']}").status_code == 204
    for method, path in [
        ("get", "/api/notebooks/999"),
        ("get", f"/api/notebooks/{nb['id']}"),
        ("get", "/api/runs/42"),
        ("patch", "/api/fields/5"),
        ("delete", "/api/errata/5"),
        ("post", "/api/skills/3/compile"),
        ("post", "/api/runs/8/cancel"),
    ]:
        r = getattr(client, method)(path, **({"json": {}} if method == "patch" else {}))
        assert r.status_code == 404, (path, r.text)
        deleted = path == f"/api/notebooks/{nb['id']}"  # ids are never reused: it says what happened
        assert ("was deleted" if deleted else "not found") in r.json()["detail"], (path, r.text)


def test_limits_answer_422_with_field_and_limit(make_client) -> None:
    client = make_client()
    r = client.post("/api/notebooks", json={"title": "x", "model": "smollm2-135m", "text": "a" * 200_001})
    assert r.status_code == 422
    error = r.json()["detail"][0]
    assert error["loc"] == ["body", "text"] and "200000" in error["msg"]
    nb = _notebook(client)
    r = client.post(
        f"/api/notebooks/{nb['id']}/fields", json={"start": 0, "end": 3, "new_value": "v", "label": "L" * 201}
    )
    assert (
        r.status_code == 422
        and r.json()["detail"][0]["loc"] == ["body", "label"]
        and "200" in r.json()["detail"][0]["msg"]
    )
    r = client.post(
        f"/api/notebooks/{nb['id']}/fields", json={"start": 5, "end": len(DOC) + 1, "new_value": "v"}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "end"]
    assert f"({len(DOC)} characters)" in r.json()["detail"][0]["msg"]
    r = client.post(f"/api/notebooks/{nb['id']}/fields", json={"start": 9, "end": 9, "new_value": "v"})
    assert r.status_code == 422 and "start < end" in r.json()["detail"][0]["msg"]
    r = client.post(
        f"/api/notebooks/{nb['id']}/runs", json={"question": "Can they log in?", "strategies": ["magic"]}
    )
    assert r.status_code == 422
    assert (
        "magic" in r.text
        and "field_erratum" in r.text
        and r.json()["detail"][0]["loc"] == ["body", "strategies"]
    )
    r = client.put(f"/api/notebooks/{nb['id']}/question", json={"text": "q" * 2001})
    assert r.status_code == 422 and "2000" in r.json()["detail"][0]["msg"]


def test_fields_make_generated_errata_and_reject_overlap(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    field = _field(client, nb)
    assert field["old_value"] == "active" and field["new_value"] == "suspended"
    (erratum,) = client.get(f"/api/notebooks/{nb}/errata").json()
    assert erratum["source"] == "generated" and erratum["field_id"] == field["id"]
    assert "status has changed from active to suspended" in erratum["text"]
    r = client.post(
        f"/api/notebooks/{nb}/fields",
        json={"start": field["start"] + 2, "end": field["end"] + 3, "new_value": "x"},
    )
    assert r.status_code == 422 and f"overlaps field {field['id']}" in r.json()["detail"][0]["msg"]
    # changing the field re-renders its generated erratum ...
    client.patch(f"/api/fields/{field['id']}", json={"new_value": "closed"})
    assert "from active to closed" in client.get(f"/api/notebooks/{nb}/errata").json()[0]["text"]
    # ... until the erratum is edited by hand
    r = client.patch(f"/api/errata/{erratum['id']}", json={"text": "Note: the account is closed."})
    assert r.json()["source"] == "custom"
    client.patch(f"/api/fields/{field['id']}", json={"new_value": "banned"})
    assert client.get(f"/api/notebooks/{nb}/errata").json()[0]["text"] == "Note: the account is closed."


def _mark_compiled(skill_id: int) -> None:
    """What a worker's compile leaves behind, written straight into the test's database."""
    from data.db import get_sessionmaker
    from data.models import Skill

    with get_sessionmaker()() as session:
        session.get(Skill, skill_id).status = "compiled"
        session.commit()


def test_errata_order_and_placements(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    generated = _field(client, nb)
    custom = client.post(f"/api/notebooks/{nb}/errata", json={"text": "Also: age is 35."}).json()
    first = client.get(f"/api/notebooks/{nb}/errata").json()[0]
    r = client.post(f"/api/notebooks/{nb}/errata/order", json={"ids": [custom["id"], first["id"]]})
    assert [e["id"] for e in r.json()] == [custom["id"], first["id"]]
    r = client.post(f"/api/notebooks/{nb}/errata/order", json={"ids": [custom["id"]]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ids"]
    skill = client.post(
        "/api/skills", json={"name": "policy", "text": "Suspended users may not log in."}
    ).json()
    assert skill["status"] == "draft"
    r = client.post(f"/api/notebooks/{nb}/placements", json={"skill_id": skill["id"], "position": 17})
    # as the page says
    assert r.status_code == 422 and "skill 'policy' is not compiled for smollm2-135m" in r.text
    _mark_compiled(skill["id"])
    r = client.post(
        f"/api/notebooks/{nb}/placements", json={"skill_id": skill["id"], "position": len(DOC) + 5}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "position"]
    placed = client.post(
        f"/api/notebooks/{nb}/placements", json={"skill_id": skill["id"], "position": 17}
    ).json()
    assert placed["skill_name"] == "policy" and placed["position"] == 17
    assert client.patch(f"/api/placements/{placed['id']}", json={"position": None}).json()["position"] is None
    assert client.delete(f"/api/fields/{generated['id']}").status_code == 204
    assert [e["id"] for e in client.get(f"/api/notebooks/{nb}/errata").json()] == [custom["id"]]


def test_run_is_enqueued_on_the_real_broker(make_client, tmp_path: Path) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    _field(client, nb)
    r = client.post(
        f"/api/notebooks/{nb}/runs",
        json={
            "question": "Can this user log in?",
            "choices": ["yes", "no"],
            "strategies": ["stale", "erratum"],
        },
    )
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "queued" and run["strategies"] == ["recompute", "stale", "erratum"]
    assert run["results"] == {} and run["progress"] == 0.0
    assert _broker_messages(tmp_path) == [
        ("model.smollm2-135m", {"task": "kvnotes.run", "id": run["task_id"], "run_id": run["id"]})
    ]
    assert client.get(f"/api/notebooks/{nb}").json()["question"]["choices"] == ["yes", "no"]
    # the default asks for every strategy, and reuses the notebook's current question
    r = client.post(f"/api/notebooks/{nb}/runs", json={})
    assert (
        r.json()["strategies"] == STRATEGIES
        and r.json()["snapshot"]["question"]["text"] == "Can this user log in?"
    )
    assert len(_broker_messages(tmp_path)) == 2
    cancelled = client.post(f"/api/runs/{run['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    assert client.post(f"/api/runs/{run['id']}/cancel").status_code == 409


def test_unreachable_broker_answers_503_and_saves_nothing(make_client, tmp_path: Path) -> None:
    client = make_client(broker_url="redis://127.0.0.1:1/0")
    nb = _notebook(client)["id"]
    r = client.post(
        f"/api/notebooks/{nb}/runs", json={"question": "Can this user log in?", "choices": ["yes", "no"]}
    )
    assert r.status_code == 503
    # plain: details to the log
    assert "broker" in r.json()["detail"] and "127.0.0.1" not in r.json()["detail"]
    assert _run_count(tmp_path) == 0
    assert client.get(f"/api/notebooks/{nb}").json()["question"] is None  # the question was not saved either
    skill = client.post("/api/skills", json={"name": "s", "text": "t"}).json()
    assert client.post(f"/api/skills/{skill['id']}/compile").status_code == 503
    assert client.get(f"/api/skills/{skill['id']}").json()["status"] == "draft"
    health = client.get("/api/health")
    assert (
        health.status_code == 503
        and health.json()["database"] == "ok"
        and health.json()["status"] == "degraded"
    )


def test_snapshot_isolation_and_deleting_a_notebook_deletes_its_runs(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    _field(client, nb)
    run = client.post(
        f"/api/notebooks/{nb}/runs", json={"question": "Can this user log in?", "choices": ["yes", "no"]}
    ).json()
    before = run["snapshot"]
    assert before["fields"] == [
        {
            "start": DOC.index("active"),
            "end": DOC.index("active") + 6,
            "old": "active",
            "new": "suspended",
            "label": "status",
        }
    ]
    assert before["document"] == DOC and len(before["errata"]) == 1
    field_id = client.get(f"/api/notebooks/{nb}").json()["fields"][0]["id"]
    client.patch(f"/api/fields/{field_id}", json={"new_value": "closed"})
    client.patch(f"/api/notebooks/{nb}", json={"text": DOC + " More."})
    client.put(f"/api/notebooks/{nb}/question", json={"text": "Other?", "choices": ["a", "b"]})
    assert client.get(f"/api/runs/{run['id']}").json()["snapshot"] == before
    assert client.delete(f"/api/notebooks/{nb}").status_code == 204
    # the deleted document must not stay readable in the run's snapshot
    assert client.get(f"/api/runs/{run['id']}").status_code == 404
    assert client.get(f"/runs/{run['id']}").status_code == 404


def test_results_and_attention_read_back(make_client) -> None:
    """What a worker writes (a result row with float16 attention) reads back under the engine's names."""
    from data.db import get_sessionmaker
    from data.models import RunResult

    client = make_client()
    nb = _notebook(client)["id"]
    run = client.post(
        f"/api/notebooks/{nb}/runs", json={"question": "Log in?", "choices": ["yes", "no"]}
    ).json()
    weights = np.arange(2 * 3 * 4, dtype=np.float16).reshape(2, 3, 4) / 32  # [layers, heads, T]
    tokens = [{"id": i, "text": f"t{i}", "start": i, "end": i + 1, "segment": "document"} for i in range(4)]
    with get_sessionmaker()() as session:
        session.add(
            RunResult(
                run_id=run["id"],
                strategy="recompute",
                decision="no",
                choice_probs={"yes": 0.2, "no": 0.8},
                kl_to_recompute=0.0,
                top1_agrees=True,
                topk_overlap=10,
                logit_cosine=1.0,
                decision_matches_recompute=True,
                tokens_computed=40,
                latency_ms=12.5,
                attention=weights.tobytes(),
                attention_shape=[2, 3, 4],
                tokens=tokens,
            )
        )
        session.commit()
    result = client.get(f"/api/runs/{run['id']}").json()["results"]["recompute"]
    assert result["decision"] == "no" and result["choice_probs"] == {"yes": 0.2, "no": 0.8}
    assert result["tokens_computed"] == 40 and "attention" not in result
    one = client.get(f"/api/runs/{run['id']}/attention", params={"layer": 1, "head": 2}).json()
    assert one["values"] == pytest.approx(weights[1, 2].astype(float).tolist()) and one["tokens"] == tokens
    mean = client.get(f"/api/runs/{run['id']}/attention", params={"layer": 0}).json()
    assert mean["agg"] == "mean" and mean["values"] == pytest.approx(
        weights[0].astype(float).mean(0).tolist(), abs=1e-4
    )
    peak = client.get(f"/api/runs/{run['id']}/attention", params={"agg": "max"}).json()
    assert peak["values"] == pytest.approx(weights.reshape(6, 4).astype(float).max(0).tolist())
    r = client.get(f"/api/runs/{run['id']}/attention", params={"layer": 2})
    assert r.status_code == 422 and "layer=2" in r.text and "has 2" in r.text
    assert client.get(f"/api/runs/{run['id']}/attention", params={"strategy": "stale"}).status_code == 404


def test_openapi_schema_is_complete(make_client) -> None:
    schema = make_client().get("/openapi.json").json()
    for path in [
        "/api/notebooks",
        "/api/notebooks/{notebook_id}/fields",
        "/api/notebooks/{notebook_id}/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/attention",
        "/api/health",
    ]:
        assert path in schema["paths"]
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            ok = (
                operation["responses"].get("200")
                or operation["responses"].get("201")
                or operation["responses"].get("202")
            )
            if ok is not None:
                assert "content" in ok, (method, path)
    assert "StrategyResultOut" in schema["components"]["schemas"]


def test_the_reaper_fails_a_run_whose_worker_went_silent_and_reading_writes_nothing(make_client) -> None:
    """A run `running` with a heartbeat older than the limit reads back `running` (a read never
    writes), and `failed` with a message a person can act on once the reaper has run (the workers'
    beat and `kvnotes serve` run it), never `running` forever."""
    from datetime import timedelta

    from data.db import get_sessionmaker
    from data.models import Run, utcnow

    client = make_client()
    nb = _notebook(client)["id"]
    fresh = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).json()
    lost = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).json()
    with get_sessionmaker()() as session:
        for run_id, age_s in ((fresh["id"], 5), (lost["id"], 600)):
            run = session.get(Run, run_id)
            run.status, run.worker = "running", "kvnotes-gone@host"
            run.started_at = run.heartbeat_at = utcnow() - timedelta(seconds=age_s)
        session.commit()
    assert client.get(f"/api/runs/{lost['id']}").json()["status"] == "running"  # no read reaps
    from data.watchdog import reap

    with get_sessionmaker()() as session:
        assert reap(session).runs == [lost["id"]]
    assert client.get(f"/api/runs/{fresh['id']}").json()["status"] == "running"
    body = client.get(f"/api/runs/{lost['id']}").json()
    assert body["status"] == "failed" and body["error"] == "worker lost while running; re-run it"


def test_a_model_no_worker_serves_is_refused(make_client) -> None:
    client = make_client()
    r = client.post("/api/notebooks", json={"title": "t", "model": "no-such-model", "text": "hello"})
    assert r.status_code == 422
    assert "model 'no-such-model' is not served here; choose one of smollm2-135m" in r.text
    assert client.get("/api/notebooks").json() == []


def test_documents_are_stored_with_unix_line_ends(make_client) -> None:
    client = make_client()
    nb = client.post("/api/notebooks", json={"title": "t",
                                             "text": "status: active\r\nplan: basic\rend"}).json()
    assert nb["text"] == "status: active\nplan: basic\nend"
    r = client.post(f"/api/notebooks/{nb['id']}/fields", json={"start": 8, "end": 14, "new_value": "closed"})
    assert r.status_code == 201 and r.json()["old_value"] == "active"


def test_a_skill_for_another_model_cannot_be_placed(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    skill = client.post("/api/skills", json={"name": "g", "text": "Be brief.", "model": "gemma3-270m"}).json()
    r = client.post(f"/api/notebooks/{nb}/placements", json={"skill_id": skill["id"], "position": None})
    assert r.status_code == 422
    assert "skill 'g' is for gemma3-270m, this notebook runs smollm2-135m" in r.text
    assert client.get(f"/api/notebooks/{nb}/placements").json() == []
