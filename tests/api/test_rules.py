"""Rules the API and the pages share, each in one place: ids are never reused (a deleted notebook's or
run's address says so), a notebook, example or run for a model nobody serves is refused (and a queued
one is failed with the reason, named by health), placed skills must be compiled and match the model,
and a worker whose process is gone does not count as live."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.api.conftest import DOC, _notebook

QUESTION = {"question": "Can this user log in?", "choices": ["yes", "no"]}


def _run(client, notebook_id: int) -> dict:
    r = client.post(f"/api/notebooks/{notebook_id}/runs", json=QUESTION)
    assert r.status_code == 201, r.text
    return r.json()


def _set_skill_status(skill_id: int, status: str) -> None:
    from data.db import get_sessionmaker
    from data.models import Skill

    with get_sessionmaker()() as session:
        session.get(Skill, skill_id).status = status
        session.commit()


def test_ids_are_never_reused_and_a_deleted_address_says_it_was_deleted(make_client) -> None:
    client = make_client()
    older = _notebook(client)["id"]
    newest = _notebook(client)["id"]
    old_run = _run(client, newest)["id"]
    assert client.delete(f"/api/notebooks/{newest}").status_code == 204
    again = _notebook(client)["id"]
    new_run = _run(client, again)["id"]
    assert (older, newest, again) == (1, 2, 3)  # SQLite alone would have given the deleted id 2 again
    assert new_run == old_run + 1
    for path, name, ident in [(f"/api/notebooks/{newest}", "notebook", newest),
                              (f"/api/runs/{old_run}", "run", old_run)]:
        r = client.get(path)
        assert r.status_code == 404 and r.json()["detail"].startswith(f"{name} {ident} was deleted"), r.text
    page = client.get(f"/runs/{old_run}")
    assert page.status_code == 404 and f"run {old_run} was deleted" in page.text
    assert '<h1 id="error-title">Deleted</h1>' in page.text  # the page in the app's layout, titled so
    assert client.get(f"/notebooks/{newest}").status_code == 404
    never = client.get(f"/api/runs/{new_run + 10}")
    assert never.status_code == 404 and never.json()["detail"] == f"run {new_run + 10} not found"


def test_a_model_nobody_serves_is_refused_for_notebooks_and_examples(make_client, tmp_path: Path) -> None:
    client = make_client(KVNOTES_DEFAULT_MODEL="tiny-llama", KVNOTES_MODELS="tiny-llama")
    r = client.post("/api/notebooks", json={"title": "t", "model": "smollm2-135m", "text": DOC})
    assert r.status_code == 422 and "model 'smollm2-135m' is not served here" in r.text
    page = client.post("/examples/access-policy")  # the example names smollm2-135m
    assert page.status_code == 422, page.text[:300]
    assert "smollm2-135m" in page.text and "is not served here" in page.text
    assert client.get("/api/notebooks").json() == []  # nothing was made


def test_a_queued_run_of_a_model_nobody_serves_fails_with_the_reason_and_health_names_it(make_client) -> None:
    from data.db import get_sessionmaker
    from data.models import Run

    client = make_client()
    nb = _notebook(client)["id"]
    run_id = _run(client, nb)["id"]
    with get_sessionmaker()() as session:  # a model this installation served once, and no more
        run = session.get(Run, run_id)
        run.snapshot = run.snapshot.model_copy(update={"model": "retired-model"})
        session.commit()
    health = client.get("/api/health").json()
    assert "runs queued for retired-model, which no worker serves" in health["workers"], health
    from data.watchdog import reap

    with get_sessionmaker()() as session:  # what the workers' beat and `kvnotes serve` run
        reap(session)
    run = client.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "failed"
    assert run["error"].startswith("no worker serves the model retired-model here"), run["error"]
    assert "retired-model" not in client.get("/api/health").json()["workers"]
    r = client.post(f"/api/runs/{run_id}/rerun")
    assert r.status_code == 422 and "model 'retired-model' is not served here" in r.text


def test_placed_skills_must_be_compiled_and_match_a_new_model(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    skill = client.post("/api/skills", json={"name": "brief", "text": "Answer in one word."}).json()
    r = client.post(f"/api/notebooks/{nb}/placements", json={"skill_id": skill["id"], "position": None})
    assert r.status_code == 422 and "skill 'brief' is not compiled for smollm2-135m" in r.text
    page = client.post(f"/notebooks/{nb}/placements", data={"skill_id": str(skill["id"]), "position": ""})
    assert page.status_code == 422 and "is not compiled for smollm2-135m" in page.text  # the same words
    _set_skill_status(skill["id"], "compiled")
    assert client.post(f"/api/notebooks/{nb}/placements", json={"skill_id": skill["id"]}).status_code == 201
    r = client.patch(f"/api/notebooks/{nb}", json={"model": "gemma3-270m"})
    assert r.status_code == 422
    assert ("skill 'brief' placed in this notebook is for smollm2-135m: remove it before changing the model"
            in r.text)
    assert client.get(f"/api/notebooks/{nb}").json()["model"] == "smollm2-135m"  # nothing changed
    placement = client.get(f"/api/notebooks/{nb}/placements").json()[0]["id"]
    assert client.delete(f"/api/placements/{placement}").status_code == 204
    changed = client.patch(f"/api/notebooks/{nb}", json={"model": "gemma3-270m"})
    assert changed.json()["model"] == "gemma3-270m"


def test_a_worker_whose_process_is_gone_is_not_live(make_client) -> None:
    """`kill -9` of serve takes its worker along; the next serve must not trust its last beat."""
    import os
    import socket

    from data import workers
    from data.db import get_sessionmaker

    client = make_client(KVNOTES_DEFAULT_MODEL="tiny-llama", KVNOTES_MODELS="tiny-llama")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a real pid, now without a process
    with get_sessionmaker()() as session:
        workers.register(session, "kvnotes-killed@here", ["model.tiny-llama"], socket.gethostname(), gone.pid)
        workers.set_running(session, "kvnotes-killed@here", None)
        session.commit()
    health = client.get("/api/health").json()
    assert health["workers"] == "no live worker for tiny-llama", health  # its beat is fresh, its process gone
    with get_sessionmaker()() as session:
        workers.register(session, "kvnotes-alive@here", ["model.tiny-llama"], socket.gethostname(),
                         os.getpid())
        session.commit()
    assert client.get("/api/health").json()["workers"] == "ok"


def test_the_prefill_task_is_gone() -> None:
    import worker.tasks  # noqa: F401  (registers the tasks)
    from data.queue import TASK_NAMES
    from worker.celery_app import app

    assert "kvnotes.prefill" not in TASK_NAMES
    assert "kvnotes.prefill" not in app.tasks and "kvnotes.run" in app.tasks


def test_a_run_that_answers_503_sends_no_message(make_client, tmp_path: Path) -> None:
    """The row is committed before the message is sent: a database that cannot take the run (here
    opened read-only) answers 503 and the broker holds nothing for it."""
    from tests.api.conftest import _broker_messages
    from tests.conftest import applied, kvnotes_env

    client = make_client()
    nb = _notebook(client)["id"]
    assert client.put(f"/api/notebooks/{nb}/question", json={"text": "Can she log in?"}).status_code == 200
    read_only = f"sqlite:///file:{tmp_path}/kvnotes.db?mode=ro&uri=true"
    with applied({**kvnotes_env(tmp_path), "DATABASE_URL": read_only, "KVNOTES_BROKER_TIMEOUT": "1"}):
        from fastapi.testclient import TestClient

        from app.main import create_app

        ro_client = TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        r = ro_client.post(f"/api/notebooks/{nb}/runs", json={})
        assert r.status_code == 503 and "nothing was saved" in r.text, r.text
    broker = tmp_path / "broker.db"
    sent = [m for _, m in _broker_messages(tmp_path) if m["task"] == "kvnotes.run"] if broker.exists() else []
    assert sent == [], "a message was sent for a run that was not saved"
    run = _run(client, nb)  # once writable, a run is saved and sent (one message, under its token)
    messages = [m for _, m in _broker_messages(tmp_path) if m["task"] == "kvnotes.run"]
    assert messages == [{"task": "kvnotes.run", "id": run["task_id"], "run_id": run["id"]}]


def test_on_postgresql_a_deleted_address_says_it_was_deleted_too(make_client, postgres_url: str) -> None:
    client = make_client(DATABASE_URL=postgres_url)
    first = _notebook(client)["id"]
    assert client.delete(f"/api/notebooks/{first}").status_code == 204
    second = _notebook(client)["id"]
    assert second == first + 1  # the sequence never goes back
    r = client.get(f"/api/notebooks/{first}")
    assert r.status_code == 404 and r.json()["detail"].startswith(f"notebook {first} was deleted"), r.text
    assert client.get(f"/api/notebooks/{second + 5}").json()["detail"] == f"notebook {second + 5} not found"
