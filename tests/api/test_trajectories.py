"""Trajectories through the API on the embedded broker (no worker): a trajectory of N turns leaves
one message on the model's queue and reads back queued with N turns to go; bad input is a 422
naming the turn with nothing saved (an unknown field label, an empty turn, more turns than
KVNOTES_MAX_TURNS, an unknown strategy); cancelling a queued one keeps it, cancelled, and a second
cancel is a 409."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from tests.api.conftest import DOC, _broker_messages, _notebook


def _with_field(client) -> int:
    nb = _notebook(client)["id"]
    start = DOC.index("active")
    r = client.post(f"/api/notebooks/{nb}/fields",
                    json={"start": start, "end": start + 6, "new_value": "banned", "label": "status"})
    assert r.status_code == 201, r.text
    return nb


def _count() -> int:
    from data.db import get_sessionmaker
    from data.trajectories import Trajectory

    with get_sessionmaker()() as s:
        return s.scalar(select(func.count(Trajectory.id)))


BODY = {"question": "Can this customer log in?", "choices": ["yes", "no"],
        "strategies": ["prefix_reuse", "erratum", "field_erratum.one_per_field"]}


def test_a_trajectory_is_queued_once_and_read_back(make_client, tmp_path: Path) -> None:
    client = make_client()
    nb = _with_field(client)
    turns = [{"append": f"\nTool result {i}."} for i in range(3)] + [{"fields": {"status": "suspended"}}]
    r = client.post(f"/api/notebooks/{nb}/trajectories", json={**BODY, "turns": turns})
    assert r.status_code == 201, r.text
    t = r.json()
    assert (t["status"], t["turns_total"], t["turns_done"], t["turns"]) == ("queued", 4, 0, [])
    assert t["strategies"] == ["recompute", "prefix_reuse", "erratum", "field_erratum.one_per_field"]
    assert t["spec"]["fields"] == [{"label": "status", "start": DOC.index("active"),
                                    "end": DOC.index("active") + 6}]
    messages = [m for q, m in _broker_messages(tmp_path) if m["task"] == "kvnotes.trajectory"]
    assert messages == [{"task": "kvnotes.trajectory", "id": messages[0]["id"], "trajectory_id": t["id"]}]
    assert client.get(f"/api/trajectories/{t['id']}").json()["turns_total"] == 4
    assert [x["id"] for x in client.get(f"/api/notebooks/{nb}/trajectories").json()] == [t["id"]]
    page = client.get(f"/trajectories/{t['id']}")
    assert page.status_code == 200 and "0 of 4 turns" in page.text and "Cancel" in page.text
    assert client.get(f"/trajectories/{t['id']}/export.json").json()["id"] == t["id"]
    assert client.get(f"/trajectories/{t['id']}/export.csv").text.startswith("trajectory_id,turn,strategy")
    done = client.post(f"/api/trajectories/{t['id']}/cancel").json()
    assert done["status"] == "cancelled" and "after 0 of 4 turns" in done["error"]
    assert client.post(f"/api/trajectories/{t['id']}/cancel").status_code == 409


def test_bad_turns_are_422_naming_the_turn_and_nothing_is_saved(make_client) -> None:
    client = make_client(KVNOTES_MAX_TURNS="5")
    nb = _with_field(client)
    cases = [
        ([{"append": "a"}, {"fields": {"tier": "gold"}}], "turns.1", "turn 2 changes a field 'tier'"),
        ([{"append": "a"}, {"append": "b"}, {}], "turns.2", "turn 3 is empty"),
        ([{"append": "a"}] * 6, "turns", "6 turns, more than KVNOTES_MAX_TURNS (5)"),
    ]
    for turns, where, message in cases:
        r = client.post(f"/api/notebooks/{nb}/trajectories", json={**BODY, "turns": turns})
        assert r.status_code == 422, r.text
        assert where in r.text and message in r.text, r.text
    r = client.post(f"/api/notebooks/{nb}/trajectories",
                    json={**BODY, "turns": [{"append": "a"}], "strategies": ["auto"]})
    assert r.status_code == 422 and "auto in a trajectory applies the notebook's adopted sweep" in r.text
    r = client.post(f"/api/notebooks/{nb}/trajectories",
                    json={**BODY, "turns": [{"append": "a"}], "strategies": ["nonesuch"]})
    assert r.status_code == 422 and "unknown trajectory strategies: 'nonesuch'" in r.text
    r = client.post(f"/api/notebooks/{nb}/trajectories", json={"turns": [{"append": "a"}]})
    assert r.status_code == 422 and "turn 1 asks no question" in r.text
    assert _count() == 0


def test_the_notebook_panel_takes_jsonl_turns(make_client) -> None:
    client = make_client()
    nb = _with_field(client)
    page = client.get(f"/notebooks/{nb}")
    assert page.status_code == 200 and f'hx-get="/notebooks/{nb}/trajectory"' in page.text
    panel = client.get(f"/notebooks/{nb}/trajectory")
    assert panel.status_code == 200 and 'name="turns.0.fields.status"' in panel.text
    form = {"question": "Can this customer log in?", "choices": "yes, no",
            "strategies": ["prefix_reuse", "erratum.one_per_field"]}
    bad = client.post(f"/notebooks/{nb}/trajectories",
                      data={**form, "turns": '{"append": "a"}\n{"append": 3}'})
    assert bad.status_code == 422 and "turns: line 2: append must be text" in bad.text
    bad = client.post(f"/notebooks/{nb}/trajectories",
                      data={**form, "turns": '{"append": "a"}\n{"fields": {"tier": "x"}}'})
    assert bad.status_code == 422 and "turn 2 changes a field &#39;tier&#39;" in bad.text
    assert _count() == 0
    ok = client.post(f"/notebooks/{nb}/trajectories",
                     data={**form, "turns": '{"append": "a"}\n{"fields": {"status": "suspended"}}\n'})
    assert ok.status_code == 204 and ok.headers["HX-Redirect"].startswith("/trajectories/")
    t = client.get(f"/api{ok.headers['HX-Redirect']}").json()
    assert t["turns_total"] == 2 and t["strategies"] == ["recompute", "prefix_reuse", "erratum.one_per_field"]
    assert t["spec"]["turns"][1]["fields"] == {"status": "suspended"}
    assert t["spec"]["choices"] == ["yes", "no"]
