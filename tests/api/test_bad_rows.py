"""Pages survive a bad row: a row saved before the text rules held (here one holding a lone
surrogate, written straight into the database) renders with its id, its unreadable text shown as
U+FFFD, on every page, answer and export that shows it; it never answers 500 for everyone."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import DOC, _notebook

BAD = "Madrid\ud800"


def _spoil(nb: int, run_id: int, sweep_id: int, trajectory_id: int) -> int:
    """Put a lone surrogate (only a JSON column can hold one: SQLite's text refuses it) in every
    run's question, the sweep's choices, the trajectory's turn and a new replay's values and choices,
    as the issue's requests saved them; returns the replay's id."""
    from data.db import get_sessionmaker
    from data.models import Run, Sweep
    from data.replays import Replay
    from data.trajectories import Trajectory
    from vocabulary.replay import ReplaySpec

    with get_sessionmaker()() as s:
        for run in s.query(Run).all():
            question = run.snapshot.question.model_copy(update={"text": f"Where? {BAD}"})
            run.snapshot = run.snapshot.model_copy(update={"question": question})
        sweep = s.get(Sweep, sweep_id)
        sweep.question = sweep.question.model_copy(update={"choices": ["yes", BAD]})
        row = s.get(Trajectory, trajectory_id)
        turns = (row.spec.turns[0].__class__(append=BAD),)
        row.spec = row.spec.__class__(**{**row.spec.__dict__, "turns": turns})
        replay = Replay(notebook_id=nb, status="failed", stage="failed", progress=0.0, created_by="local",
                        snapshot=ReplaySpec(url="http://127.0.0.1:8100", model="m", document=DOC, start=0,
                                            end=8, label="the value", values=(BAD,), question="Where?",
                                            choices=("Oslo", BAD)))
        s.add(replay)
        s.commit()
        return replay.id


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_row_holding_a_lone_surrogate_renders_with_its_id_everywhere(make_client, request,
                                                                       database: str) -> None:
    client = make_client(**({"DATABASE_URL": request.getfixturevalue("postgres_url")}
                            if database == "postgresql" else {}))
    nb = _notebook(client)["id"]
    start = DOC.index("active")
    field = {"start": start, "end": start + 6, "new_value": "banned", "label": "status"}
    assert client.post(f"/api/notebooks/{nb}/fields", json=field).status_code == 201
    ask = {"question": "Can this customer log in?", "choices": ["yes", "no"]}
    run_id = client.post(f"/api/notebooks/{nb}/runs", json=ask).json()["id"]
    sweep = client.post(f"/api/notebooks/{nb}/sweeps", json={**ask, "values": {"status": ["banned", "gone"]},
                                                             "strategies": ["recompute", "erratum"]})
    assert sweep.status_code == 201, sweep.text
    sweep_id = sweep.json()["id"]
    trajectory = client.post(f"/api/notebooks/{nb}/trajectories", json={"turns": [{"append": "More."}]})
    assert trajectory.status_code == 201, trajectory.text
    trajectory_id = trajectory.json()["id"]
    replay_id = _spoil(nb, run_id, sweep_id, trajectory_id)
    # every page, answer and export that shows one of these rows, and whether it shows the spoiled
    # text (a run's question, a sweep's choices, a replay's values, a trajectory's turn): then as U+FFFD
    pages = {"/runs": True, "/": False, f"/notebooks/{nb}": True, f"/api/notebooks/{nb}": False,
             "/api/notebooks": False, f"/api/runs/{run_id}": True, f"/runs/{run_id}": True,
             f"/runs/{run_id}/export.json": True, f"/runs/{run_id}/export.csv": False,
             f"/runs/{run_id}/report.html": True, f"/api/sweeps/{sweep_id}": True,
             f"/sweeps/{sweep_id}": True,
             f"/sweeps/{sweep_id}/export.json": True, f"/sweeps/{sweep_id}/export.csv": False,
             f"/sweeps/{sweep_id}/report.html": True, f"/notebooks/{nb}/sweep": False,
             f"/api/notebooks/{nb}/replays": True, f"/api/replays/{replay_id}": True,
             f"/replays/{replay_id}": True, f"/replays/{replay_id}/export.json": True,
             f"/replays/{replay_id}/export.csv": False, f"/notebooks/{nb}/serving": False,
             f"/api/trajectories/{trajectory_id}": True, f"/api/notebooks/{nb}/trajectories": True,
             f"/trajectories/{trajectory_id}": False, f"/trajectories/{trajectory_id}/export.json": True,
             f"/trajectories/{trajectory_id}/export.csv": False,
             f"/trajectories/{trajectory_id}/report.html": True, f"/notebooks/{nb}/trajectory": False,
             f"/api/trajectories/{trajectory_id}/replays": False,
             f"/trajectories/{trajectory_id}/serving": False}
    failed = []
    for path, shows in pages.items():
        try:
            r = client.get(path)
        except Exception as exc:  # the test client raises what the app did not answer
            failed.append((path, 500, repr(exc)[:200]))
            continue
        text = r.content.decode("utf-8")  # valid UTF-8, whatever the row holds
        leaked = "built-in method" in text or "bound method" in text  # `{{ errors.values }}` of a dict
        if r.status_code != 200 or shows and "\ufffd" not in text or leaked:
            failed.append((path, r.status_code, text[:200]))
        if r.headers["content-type"].startswith("application/json"):
            json.loads(text)
    assert [f[:2] for f in failed] == [], failed
    assert f'href="/runs/{run_id}">#{run_id}</a>' in client.get("/runs").text  # the row, with its id
    if database == "postgresql":
        from data.db import reset_engines

        reset_engines()  # let the scratch database be dropped


def test_stored_json_reads_lone_surrogates_as_the_placeholder_and_keeps_pairs() -> None:
    from vocabulary.text_rules import loads, unrenderable

    stored = json.dumps({"choices": ["Oslo", BAD], "st\udc00tus": 1, "face": "\U0001f600", "n": [1.5, None]})
    assert "\\ud800" in stored and "\\ud83d\\ude00" in stored  # as the JSON column holds them
    read = loads(stored)
    assert read == {"choices": ["Oslo", "Madrid\ufffd"], "st\ufffdtus": 1, "face": "\U0001f600",
                    "n": [1.5, None]}
    assert unrenderable(json.loads(stored)) == "choices.1" and unrenderable(read) is None
    assert loads('"\\ud83d\\ude00"') == "\U0001f600"  # a pair is one character, kept
