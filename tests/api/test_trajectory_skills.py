"""Skills, hoist and auto in trajectories through the API: a turn places a compiled skill of the
notebook's model by name, and the spec the worker runs carries the skill's text and row; hoist is
accepted; auto is refused (422, nothing saved) until the notebook adopts a sweep's policy, and then
the spec carries that policy. An unknown or uncompiled skill is a 422 naming the turn. Then the
real compile and trajectory tasks, in this process on tiny-llama: the stored skill is spliced."""

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


def test_the_worker_splices_the_stored_skill_and_runs_hoist_and_auto(make_client,
        engines_without_store) -> None:
    """On tiny-llama, the skill compiled by the real `kvnotes.compile_skill` task and the trajectory
    run by the real `kvnotes.trajectory` task, in this process: the worker finds the skill's stored
    notes (not once its text changed); at the turn that places it every strategy that is not exact
    splices its tokens and computes only the turn's text, the exact ones splice none; auto is
    erratum (the adopted policy) token for token; the page says so."""
    from data.db import get_sessionmaker
    from data.trajectories import Trajectory
    from worker.mapping import stored_skill_notes
    from worker.runtime import get_engine
    from worker.tasks import compile_skill
    from worker.trajectory_task import trajectory_task

    client = make_client(KVNOTES_MODELS="smollm2-135m,tiny-llama")
    r = client.post("/api/notebooks", json={"title": "agent", "model": "tiny-llama", "text": DOC})
    nb = r.json()["id"]
    start = DOC.index("active")
    assert client.post(f"/api/notebooks/{nb}/fields", json={"start": start, "end": start + 6,
                                                            "new_value": "banned", "label": "status"}
                       ).status_code == 201
    skill = {"name": "refunds", "text": REFUNDS, "model": "tiny-llama"}
    sid = client.post("/api/skills", json=skill).json()["id"]
    assert compile_skill.apply(args=(sid,)).get()["status"] == "compiled"
    eng = get_engine("tiny-llama")
    stored = stored_skill_notes(eng, sid, REFUNDS)
    assert stored is not None and stored.token_ids[1:] == eng.encode(REFUNDS)
    assert stored_skill_notes(eng, sid, REFUNDS + "changed") is None
    _adopt(nb, "erratum")
    turns = [{"append": "\n[tool] lookup 1."}, {"skill": "refunds", "append": "\n[tool] lookup 2."},
             {"fields": {"status": "suspended"}, "append": "\n[tool] lookup 3."}]
    r = client.post(f"/api/notebooks/{nb}/trajectories",
                    json={**BODY, "turns": turns, "strategies": ["prefix_reuse", "erratum", "hoist", "auto"]})
    assert r.status_code == 201, r.text
    with get_sessionmaker()() as s:
        token = s.get(Trajectory, r.json()["id"]).task_id
    assert trajectory_task.apply(args=(r.json()["id"],), task_id=token).get()["status"] == "succeeded"
    t = client.get(f"/api/trajectories/{r.json()['id']}").json()
    m, appended = len(eng.encode(REFUNDS)), len(eng.encode(turns[1]["append"]))
    at = t["turns"][1]["results"]
    assert {k: at[k]["tokens_spliced"] for k in at} == {"recompute": 0, "prefix_reuse": 0, "erratum": m,
                                                         "hoist": m, "auto": m}
    assert at["erratum"]["tokens_computed"] == appended and at["prefix_reuse"]["tokens_computed"] >= m
    for turn in t["turns"]:
        auto, erratum = turn["results"]["auto"], turn["results"]["erratum"]
        assert (auto["decision"], auto["tokens_computed"], auto["cache_tokens"]) == \
            (erratum["decision"], erratum["tokens_computed"], erratum["cache_tokens"])
    assert t["turns"][2]["results"]["auto"]["errata"] == 1
    page = client.get(f"/trajectories/{t['id']}").text
    assert "placed the skill refunds" in page and f"+{m} spliced" in page
