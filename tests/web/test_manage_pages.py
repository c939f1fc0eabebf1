"""Notebooks a team can manage, through FastAPI's test client on a fresh database (runs are really
enqueued on the embedded broker; no worker runs them): rename, duplicate and delete (with the
confirmation naming the runs that go too), the history with "run this snapshot again", an
example that is already open, paginated lists, the home cards' last outcome, and a field made
from the n-th occurrence of a text."""

from __future__ import annotations

import html
import re

import pytest

from data.models import Erratum, Field, Notebook, Placement, Question, Run, Skill
from tests.web.conftest import DOC, HX, add_field, new_notebook, session
from tests.web.finished_run import finished_run


@pytest.fixture
def client(make_client):
    return make_client()


def with_question(s, nb: int) -> Notebook:
    """The notebook `nb` in session `s`, given the status question."""
    notebook = s.get(Notebook, nb)
    notebook.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
    s.commit()
    return notebook


def test_rename_from_the_page_and_the_api(client) -> None:
    nb = new_notebook(client)
    resp = client.post(f"/notebooks/{nb}/rename", data={"title": "  Access review  "}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == f"/notebooks/{nb}"
    assert session().get(Notebook, nb).title == "Access review"
    blank = client.post(f"/notebooks/{nb}/rename", data={"title": "   "})
    assert (blank.status_code == 422 and 'id="err-title"' in blank.text
            and "<details class=\"menu\" open>" in blank.text)
    too_long = client.post(f"/notebooks/{nb}/rename", data={"title": "x" * 300})
    assert too_long.status_code == 422 and "at most 200 characters" in too_long.text
    assert session().get(Notebook, nb).title == "Access review"
    assert (client.patch(f"/api/notebooks/{nb}", json={"title": "Via the API"}).json()["title"]
            == "Via the API")


def test_duplicate_copies_the_edits_but_not_the_runs(client) -> None:
    nb = new_notebook(client, title="Original")
    add_field(client, nb)
    client.post(f"/notebooks/{nb}/errata", data={"text": "[NOTE] by hand"}, headers=HX)
    s = session()
    skill = Skill(name="one word", text="Answer with one word.", model="smollm2-135m", status="compiled")
    s.add(skill)
    s.commit()
    client.post(f"/notebooks/{nb}/placements", data={"skill_id": skill.id, "position": ""}, headers=HX)
    finished_run(s, with_question(s, nb))
    resp = client.post(f"/notebooks/{nb}/duplicate", follow_redirects=False)
    assert resp.status_code == 303
    copy_id = int(resp.headers["location"].rsplit("/", 1)[1])
    s = session()
    original, copy = s.get(Notebook, nb), s.get(Notebook, copy_id)
    assert copy.title == "Copy of Original" and copy.document == original.document
    assert [(f.start, f.end, f.old_value, f.new_value, f.label) for f in copy.fields] == \
           [(f.start, f.end, f.old_value, f.new_value, f.label) for f in original.fields]
    assert ([(e.text, e.source, e.position) for e in copy.errata]
            == [(e.text, e.source, e.position) for e in original.errata])
    generated = next(e for e in copy.errata if e.source == "generated")
    assert generated.field_id == copy.fields[0].id  # tied to the copied field, not the original's
    assert [p.skill_id for p in copy.placements] == [skill.id]
    assert copy.question.text == "What is the status?" and copy.question.choices == ["active", "suspended"]
    assert s.query(Run).filter_by(notebook_id=copy_id).count() == 0
    api = client.post(f"/api/notebooks/{nb}/duplicate")
    assert (api.status_code == 201 and api.json()["title"] == "Copy of Original"
            and len(api.json()["fields"]) == 1)


def test_delete_asks_first_and_says_the_runs_go_too(client) -> None:
    nb = new_notebook(client, title="Doomed")
    add_field(client, nb)
    s = session()
    notebook = with_question(s, nb)
    finished_run(s, notebook)
    finished_run(s, notebook)
    assert f'href="/notebooks/{nb}/delete"' in client.get(f"/notebooks/{nb}").text
    confirm = client.get(f"/notebooks/{nb}/delete")
    assert confirm.status_code == 200
    assert "Deleting this notebook also deletes its 2 runs, with their results and snapshots" in confirm.text
    assert "Delete the notebook and its 2 runs</button>" in confirm.text
    assert session().get(Notebook, nb) is not None  # asking deletes nothing
    done = client.post(f"/notebooks/{nb}/delete", follow_redirects=True)
    assert "Deleted notebook “Doomed” and its 2 runs." in done.text
    s = session()
    assert s.get(Notebook, nb) is None and s.query(Run).count() == 0
    assert s.query(Field).count() == s.query(Erratum).count() == s.query(Placement).count() == 0
    assert client.get(f"/notebooks/{nb}/delete").status_code == 404


def test_history_shows_each_snapshot_and_runs_it_again(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    run = finished_run(s, with_question(s, nb))
    run_id, snapshot = run.id, run.snapshot
    # the notebook moves on
    client.post(f"/notebooks/{nb}/errata", data={"text": "[NOTE] added after the run"}, headers=HX)
    page = client.get(f"/notebooks/{nb}").text
    assert "History: every run and its snapshot" in page
    assert f'<form method="post" action="/runs/{run_id}/rerun">' in page and "Run this snapshot again" in page
    assert f'name="runs" value="{run_id}" form="compare-runs"' in page  # ticks for /compare
    again = client.post(f"/runs/{run_id}/rerun", follow_redirects=False)
    assert again.status_code == 303
    new = session().get(Run, int(again.headers["location"].rsplit("/", 1)[1]))
    assert new.status == "queued" and new.notebook_id == nb and new.task_id
    assert new.snapshot == snapshot  # what that run ran on, not the notebook as it is now
    assert "[NOTE] added after the run" not in new.snapshot.errata
    api = client.post(f"/api/runs/{run_id}/rerun")
    assert api.status_code == 201 and api.json()["snapshot"] == snapshot.model_dump(mode="json")
    assert client.post("/runs/987654/rerun").status_code == 404


def test_history_paginates(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    notebook = with_question(s, nb)
    ids = [finished_run(s, notebook).id for _ in range(12)]
    first = client.get(f"/notebooks/{nb}").text
    assert len(re.findall(r'name="runs" value="(\d+)"', first)) == 10
    assert f'href="/notebooks/{nb}?history=2#history" rel="next"' in first and "Page 1 of 2" in first
    second = client.get(f"/notebooks/{nb}?history=2").text
    assert [int(i) for i in re.findall(r'name="runs" value="(\d+)"', second)] == sorted(ids)[:2][::-1]
    assert f"Latest run #{max(ids)}" in second  # the page head still points at the newest
    api = client.get(f"/api/notebooks/{nb}/runs", params={"limit": 5, "offset": 10}).json()
    assert [r["id"] for r in api] == sorted(ids)[:2][::-1]


def test_home_paginates_and_shows_each_notebooks_last_outcome(client) -> None:
    nb = new_notebook(client, title="With a run")
    add_field(client, nb)
    s = session()
    finished_run(s, with_question(s, nb), strategies=("recompute", "prefix_reuse", "stale", "field_erratum"))
    for i in range(29):
        s.add(Notebook(title=f"Bulk {i:02d}", model="smollm2-135m", document=f"Document {i}."))
    s.commit()
    home = client.get("/").text
    assert home.count('<li class="card">') == 24 and "Page 1 of 2" in home and "(1–24 of 30)" in home
    assert 'href="/?page=2" rel="next"' in home
    second = client.get("/?page=2").text
    assert second.count('<li class="card">') == 6
    card = second.split("With a run")[1].split("</li>")[0]  # the oldest edit: last on the last page
    assert "<strong>2 of 3</strong> strategies follow the edit, as recompute does" in card  # the run page's
    assert "best <strong>11.8×</strong>" in card
    assert "no runs yet" in second
    assert client.get("/?page=99").text.count('<li class="card">') == 6  # past the end: the last page


def test_home_card_says_when_the_edit_did_not_change_recompute(client) -> None:
    """Recompute keeps the old value: the card says so instead of counting strategies, and names no
    best speed-up (nothing can be told apart on the decision)."""
    nb = new_notebook(client, title="Kept the old value")
    add_field(client, nb)
    s = session()
    run = finished_run(s, with_question(s, nb))
    for r in run.results:
        r.edit_followed = "old"
    s.commit()
    card = html.unescape(client.get("/").text.split("Kept the old value")[1].split("</li>")[0])
    assert "the edit did not change recompute's answer: it keeps the old value" in card
    assert "of 2</strong>" not in card and "best <strong>" not in card


def test_runs_and_skills_lists_paginate(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    notebook = with_question(s, nb)
    for _ in range(51):
        finished_run(s, notebook, strategies=("recompute",))
    for i in range(51):
        s.add(Skill(name=f"skill {i}", text="Answer briefly.", model="smollm2-135m"))
    s.commit()
    runs = client.get("/runs").text
    assert len(re.findall(r'name="runs" value="', runs)) == 50 and "Page 1 of 2" in runs
    assert len(re.findall(r'name="runs" value="', client.get("/runs?page=2").text)) == 1
    assert "Page 1 of 2" in client.get("/skills").text


def test_an_example_already_open_is_offered_instead_of_copied(client) -> None:
    first = client.post("/examples/access-policy", follow_redirects=False)
    nb = int(first.headers["location"].rsplit("/", 1)[1])
    home = client.get("/").text
    assert f'<a class="button" href="/notebooks/{nb}"' in home and "Open example:" in home
    again = client.post("/examples/access-policy", follow_redirects=False)
    assert again.status_code == 200 and "This example is already open" in again.text
    assert f'href="/notebooks/{nb}">Open' in again.text and 'name="again" value="1"' in again.text
    assert session().query(Notebook).count() == 1  # no silent copy
    copy = client.post("/examples/access-policy", data={"again": "1"}, follow_redirects=False)
    assert copy.status_code == 303 and session().query(Notebook).count() == 2


def test_a_field_from_the_nth_occurrence_of_a_text(client) -> None:
    nb = new_notebook(client)
    resp = client.post(f"/notebooks/{nb}/fields/find", headers=HX,
                       data={"find": "active", "occurrence": "2", "label": "rule", "new_value": "suspended"})
    assert resp.status_code == 200 and resp.headers["HX-Reswap"] == "none"
    assert "Made a field of “active” at characters" in resp.text
    field = session().query(Field).one()
    second = DOC.index("active", DOC.index("active") + 1)
    assert (field.start, field.end, field.label) == (second, second + 6, "rule")
    for data, where, words in (
        ({"find": "active", "occurrence": "3", "new_value": "x"}, "occurrence",
         "&#39;active&#39; occurs 2 times; there is no occurrence 3"),
        ({"find": "missing", "occurrence": "1", "new_value": "x"}, "find", "is not in the document"),
        ({"find": "Dana", "occurrence": "1", "new_value": ""}, "new_value", "give the field its new value"),
        ({"find": "active", "occurrence": "two", "new_value": "x"}, "occurrence", "must be a whole number"),
        ({"find": "active", "occurrence": "2", "new_value": "x"}, "start", "overlaps field"),
    ):
        bad = client.post(f"/notebooks/{nb}/fields/find", data=data, headers=HX)
        assert bad.status_code == 422, data
        assert words in bad.text and f'value="{data["find"]}"' in bad.text, (data, bad.text)
        if where != "start":
            assert f'id="err-{where}"' in bad.text
    assert session().query(Field).count() == 1
