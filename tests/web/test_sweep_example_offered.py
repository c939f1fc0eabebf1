"""The home page's sweep example (`examples/sweeps/destination-city.json`) is offered in the app: a
card that says what it will show, the threshold and why (the changed edits it takes), and how long
the measured run took; it loads the notebook (the field, the question) and opens its Sweep panel with
the example's values, strategies, threshold and "stop once decided" filled in; the card then opens
that notebook."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from vocabulary.confidence import lower_bound

SWEEPS = Path(__file__).resolve().parents[2] / "examples" / "sweeps"
SPEC = json.loads((SWEEPS / "destination-city.json").read_text(encoding="utf-8"))
MEASURED = json.loads((SWEEPS / "destination-city.measured.json").read_text(encoding="utf-8"))


@pytest.fixture
def client(make_client):
    return make_client()


def test_the_card_states_what_it_shows_the_threshold_and_how_long():
    """Issue 51 item 4: the card promises a policy cheaper than prefix_reuse, decided; it states the
    threshold and how many agreeing changed edits it takes (computed, not typed), and the measured
    time; the count is the first n at which n agreeing edits of n lift the lower bound to it."""
    from app.web.notebooks.sweep_examples import read_sweep_example

    sx = read_sweep_example("destination-city")
    assert sx.threshold == SPEC["threshold"] == 0.8 and sx.stop_when_decided
    assert sx.needed == 29  # the 95% confidence sequence's lower bound of 29 of 29 reaches 0.80
    assert lower_bound(29, 29) >= 0.8 > lower_bound(28, 28)
    assert len(SPEC["fields"][0]["values"]) > sx.needed  # enough values to decide, with a margin
    m = sx.measured
    assert m is not None and m.model == SPEC["model"] and m.decided and m.policy == SPEC["expected_policy"]
    assert m.cost_share < m.prefix_reuse_share  # cheaper than prefix_reuse
    assert m.seconds < 600  # measured: it decided within 10 minutes


def test_the_sweep_example_is_offered_and_opens_its_sweep_prefilled(client) -> None:
    home = unescape(client.get("/").text)
    assert 'action="/examples/sweeps/destination-city"' in home
    assert f"Load sweep example: {SPEC['title']}" in home
    promise = re.search(r"<p class=\"example-promise\" data-sweep-promise>(.*?)</p>", home, re.S).group(1)
    promise = re.sub(r"<[^>]+>", "", promise)
    run = MEASURED["models"][SPEC["model"]]
    minutes = -(-run["seconds"] // 60)
    assert "a policy cheaper than prefix_reuse, decided" in promise
    assert "Threshold 0.80" in promise and "29 changed edits, every one agreeing" in promise
    assert f"in_place decided after {run['edits_done']} edits in about {minutes:.0f} min" in promise
    loaded = client.post("/examples/sweeps/destination-city", follow_redirects=False)
    assert loaded.status_code == 303, loaded.text
    location = loaded.headers["location"]
    assert location.endswith("#sweep")
    nb_id = int(re.search(r"/notebooks/(\d+)", location).group(1))
    nb = client.get(f"/api/notebooks/{nb_id}").json()
    assert nb["model"] == SPEC["model"] and nb["text"] == SPEC["document"]
    assert [f["label"] for f in nb["fields"]] == ["destination city"]
    panel = unescape(client.get(f"/notebooks/{nb_id}/sweep").text)
    boxes = re.findall(r'<textarea id="sweep-values-\d+" name="values_\d+" rows="3">(.*?)</textarea>',
                       panel, re.S)
    assert boxes == ["\n".join(SPEC["fields"][0]["values"])]
    assert f'value="{SPEC["question"]}"' in panel and 'value="0.80"' in panel
    assert re.search(r'name="stop_when_decided" value="1" checked', panel)
    checked = re.findall(r'name="strategies" value="(\w+)" checked', panel)
    assert sorted(checked) == sorted(SPEC["strategies"])
    again = client.post("/examples/sweeps/destination-city", follow_redirects=False)  # no second copy
    assert again.headers["location"] == location
    assert f"Open sweep example: {SPEC['title']}" in client.get("/").text
    assert client.post("/examples/sweeps/nope", follow_redirects=False).status_code == 422
