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


def test_the_serving_panel_sets_the_measured_hit_rate_beside_both_estimates(client) -> None:
    """Per variant: the replay's measured prefix-cache hit rate, the replay's own estimate and the
    notebook's latest run's `prefix_cache_share` for the strategy of that name, with a legend line
    defining both; a strategy the run did not run reads "–"."""
    from tests.web.conftest import page_run
    from vocabulary.replay import ReplayResult, ReplaySpec, VariantResult

    nb, _, run = page_run(client, strategies=("recompute", "in_place", "erratum"))  # erratum 97%, in_place 2%
    measured = {"in_place": (0.031, 0.05), "erratum": (0.937, 0.95), "hoist": (0.960, 0.97)}
    result = ReplayResult(url="http://127.0.0.1:9/v1", model="m", rate=1.0, concurrency=4, max_model_len=2048,
                          load_average=0.5,
                          variants={name: VariantResult(requests=4, prefix_hit_rate=hit, ttft_p50_ms=300.0,
                                                        ttft_p90_ms=320.0, throughput_rps=1.0,
                                                        prompt_tokens=400, agreement=1.0,
                                                        estimated_prefix_share=est,
                                                        ttft_ms=[300.0] * 4, hit_rates=[hit] * 4,
                                                        answers=["suspended"] * 4, values=["suspended"] * 4)
                                    for name, (hit, est) in measured.items()})
    spec = ReplaySpec(url="http://127.0.0.1:9/v1", document="status: active", start=8, end=14, label="status",
                      values=("suspended",), question="What is the status?", choices=("active", "suspended"))
    s = session()
    replay = Replay(notebook_id=nb, snapshot=spec, status="succeeded", stage="done", progress=1.0,
                    result=result)
    s.add(replay)
    s.commit()
    for page in (client.get(f"/replays/{replay.id}/panel").text, client.get(f"/notebooks/{nb}/serving").text,
                 client.get(f"/replays/{replay.id}").text):
        cells = {}
        for name in measured:
            row = page.split(f'<tr data-variant="{name}">')[1].split("</tr>")[0]
            cells[name] = [row.split(f'data-metric="{m}">')[1].split("</td>")[0]
                           for m in ("prefix_hit_rate", "estimated_prefix_share", "run_prefix_cache_share")]
        assert cells == {"in_place": ["3.1%", "5.0%", "2.0%"], "erratum": ["93.7%", "95.0%", "97.0%"],
                         "hoist": ["96.0%", "97.0%", "–"]}, cells
        assert f'run <a href="/runs/{run.id}">#{run.id}</a></th>' in page
        legend = page.split("data-estimate-legend>")[1].split("</p>")[0]
        assert ("prompt tokens the server took from its prefix cache, over all prompt tokens" in legend
                and "the share of the prompt this variant (or the strategy of its name) sends that an "
                    "exact-prefix cache already holds from the original prompt" in legend
                and f"run #{run.id}" in legend), legend
    # a notebook with no run of these strategies: the run's column reads – and says why
    s.delete(s.get(Run, run.id))
    s.commit()
    box = client.get(f"/replays/{replay.id}/panel").text
    assert box.count('data-metric="run_prefix_cache_share">–</td>') == 3
    assert "none has run these strategies" in box
