"""The question saved on its own, and a replay whose values fall outside the question's choices:
refused with the reason before anything is asked of a server, or sent with the choices extended
(the snapshot says which). No vLLM server is needed: these checks come before the first request."""

from __future__ import annotations

import pytest

from data.models import Notebook, Run
from data.replays import Replay
from tests.conftest import free_port
from tests.web.conftest import HX, add_field, new_notebook, session


@pytest.fixture
def client(make_client):
    return make_client()


def _ask(client, nb: int, choices: str, text: str = "What is the status?"):
    return client.post(f"/notebooks/{nb}/question", data={"question": text, "choices": choices}, headers=HX)


def test_the_question_and_choices_are_saved_without_a_run(client) -> None:
    nb = new_notebook(client)
    resp = _ask(client, nb, "active\nsuspended\n")
    assert resp.status_code == 200 and "Saved: the question, with 2 choices." in resp.text
    s = session()
    question = s.get(Notebook, nb).question
    assert (question.text, question.choices) == ("What is the status?", ["active", "suspended"])
    assert s.query(Run).count() == 0
    page = client.get(f"/notebooks/{nb}").text
    assert "What is the status?</textarea>" in page and "active\nsuspended</textarea>" in page
    bad = _ask(client, nb, "only one", text="  ")
    assert bad.status_code == 422 and "write the question to save" in bad.text
    assert session().get(Notebook, nb).question.choices == ["active", "suspended"]  # nothing lost


def test_a_replay_with_values_outside_the_choices_is_refused_or_extends_them(client) -> None:
    from app.schemas import ReplayCreate
    from app.services.replays import snapshot_for

    nb = new_notebook(client)
    add_field(client, nb)  # active → suspended
    assert _ask(client, nb, "active\nsuspended").status_code == 200
    dead = f"http://127.0.0.1:{free_port()}/v1"
    form = {"url": dead, "values": "suspended\nclosed\nActive.\nfrozen\nclosed", "rate": "1",
            "concurrency": "4", "variants": ["erratum"]}
    refused = client.post(f"/notebooks/{nb}/replays", data=form)
    assert refused.status_code == 422
    assert ("closed, frozen are not among the question&#39;s choices (active, suspended)" in refused.text
            and "could never agree" in refused.text), refused.text
    assert 'name="extend_choices"' in refused.text  # the way out is offered beside the message
    extended = client.post(f"/notebooks/{nb}/replays", data={**form, "extend_choices": "1"})
    assert extended.status_code == 422 and "did not answer as vLLM does" in extended.text  # past the check
    assert session().query(Replay).count() == 0

    notebook = session().get(Notebook, nb)
    body = ReplayCreate(url=dead, values=["suspended", "closed", "Active.", "frozen"], extend_choices=True)
    snap = snapshot_for(notebook, body, free=True)
    assert snap.choices == ("active", "suspended", "closed", "frozen")
    assert snap.extended_choices == ("closed", "frozen")
    inside = snapshot_for(notebook, ReplayCreate(url=dead, values=["suspended", "active"]), free=True)
    assert inside.extended_choices == () and inside.choices == ("active", "suspended")
    # yes/no choices name no value of the field: any value may be replayed
    assert _ask(client, nb, "yes\nno", text="May the account log in?").status_code == 200
    notebook = session().get(Notebook, nb)
    yes_no = snapshot_for(notebook, ReplayCreate(url=dead, values=["closed"]), free=True)
    assert yes_no.choices == ("yes", "no")


def test_the_serving_panel_offers_the_notebooks_own_values_as_placeholder(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    _ask(client, nb, "active\nsuspended")
    panel = client.get(f"/notebooks/{nb}/serving").text
    assert 'placeholder="suspended&#10;active"' in panel and "07:20" not in panel
    assert "Every answer is one of the question's choices: active, suspended" in panel
