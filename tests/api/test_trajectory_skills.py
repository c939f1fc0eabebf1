"""Skills, hoist and auto in trajectories through the API (no worker): a turn places a compiled
skill of the notebook's model by name, and the spec the worker runs carries the skill's text and
row; hoist is accepted; auto is refused (422, nothing saved) until the notebook adopts a sweep's
policy, and then the spec carries that policy. An unknown or uncompiled skill is a 422 naming the
turn."""

from __future__ import annotations

from sqlalchemy import func, select

from tests.api.conftest import DOC, _notebook

BODY = {"question": "Can this customer log in?", "choices": ["yes", "no"]}
REFUNDS = "Refund policy: refunds go only to active customers.\n"


def _with_field(client) -> int:
    nb = _notebook(client)["id"]
    start = DOC.index("active")
    r = client.post(f"/api/notebooks/{nb}/fields",
                    json={"start": start, "end": start + 6, "new_value": "banned", "label": "status"})
    assert r.status_code == 201, r.text
    return nb


def _skill(client, name: str, text: str, compiled: bool) -> int:
    """A skill of smollm2-135m; marked compiled in the database (no worker here)."""
    from data.db import get_sessionmaker
    from data.models import Skill

    r = client.post("/api/skills", json={"name": name, "text": text, "model": "smollm2-135m"})
    assert r.status_code == 201, r.text
    if compiled:
        with get_sessionmaker()() as s:
            skill = s.get(Skill, r.json()["id"])
            skill.status, skill.store_key, skill.token_count = "compiled", "key-of-" + name, 12
            s.commit()
    return r.json()["id"]


def _count() -> int:
    from data.db import get_sessionmaker
    from data.trajectories import Trajectory

    with get_sessionmaker()() as s:
        return s.scalar(select(func.count(Trajectory.id)))


def _adopt(nb: int, strategy: str) -> None:
    from data.db import get_sessionmaker
    from data.models import Notebook

    with get_sessionmaker()() as s:
        s.get(Notebook, nb).policy_strategy = strategy
        s.commit()


def test_a_turn_places_a_compiled_skill_and_hoist_and_auto_are_carried(make_client) -> None:
    client = make_client()
    nb = _with_field(client)
    _skill(client, "refunds", "an older text\n", compiled=True)
    newest = _skill(client, "refunds", REFUNDS, compiled=True)
    _skill(client, "drafty", "not compiled yet\n", compiled=False)
    turns = [{"append": "\nTool result 1."}, {"skill": "refunds", "append": "\nTool result 2."},
             {"skill": "refunds"}, {"fields": {"status": "suspended"}}]
    cases = [
        ([{"append": "a"}, {"skill": "nope"}], "turns.1",
         "turn 2 places a skill 'nope' that is not a compiled skill of smollm2-135m"),
        ([{"skill": "drafty"}], "turns.0", "turn 1 places a skill 'drafty' that is not a compiled skill"),
    ]
    for bad, where, message in cases:
        r = client.post(f"/api/notebooks/{nb}/trajectories", json={**BODY, "turns": bad})
        assert r.status_code == 422 and where in r.text and message in r.text, r.text
    strategies, url = ["prefix_reuse", "erratum", "hoist", "auto"], f"/api/notebooks/{nb}/trajectories"
    r = client.post(url, json={**BODY, "turns": turns, "strategies": strategies})
    assert r.status_code == 422 and "auto in a trajectory applies the notebook's adopted sweep" in r.text
    assert _count() == 0

    _adopt(nb, "erratum")
    r = client.post(url, json={**BODY, "turns": turns, "strategies": strategies})
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert r.json()["strategies"] == ["recompute", *strategies]
    assert spec["skills"] == [{"name": "refunds", "text": REFUNDS, "skill_id": newest}]  # the latest, once
    assert [t["skill"] for t in spec["turns"]] == [None, "refunds", "refunds", None]
    assert spec["policy"] == "erratum"
    without = client.post(f"/api/notebooks/{nb}/trajectories",
                          json={**BODY, "turns": turns[:1], "strategies": ["hoist"]}).json()
    assert without["spec"]["policy"] is None and without["spec"]["skills"] == []
    assert _count() == 2
    page = client.get(f"/trajectories/{r.json()['id']}").text
    assert "auto follows the adopted policy: <code>erratum</code>" in page
