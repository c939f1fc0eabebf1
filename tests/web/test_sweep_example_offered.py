"""The README's agent-status sweep (`examples/sweeps/agent-status.json`) is offered in the app: a card
on the home page loads its notebook (both fields, the question) and opens its Sweep panel with the
example's 20 values per field, strategies and threshold filled in; the card then opens that notebook."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

SPEC = json.loads((Path(__file__).resolve().parents[2] / "examples" / "sweeps" / "agent-status.json")
                  .read_text(encoding="utf-8"))


@pytest.fixture
def client(make_client):
    return make_client()


def test_the_agent_status_sweep_is_offered_and_opens_its_sweep_prefilled(client) -> None:
    home = client.get("/").text
    assert 'action="/examples/sweeps/agent-status"' in home
    assert f"Load sweep example: {SPEC['title']}" in home
    loaded = client.post("/examples/sweeps/agent-status", follow_redirects=False)
    assert loaded.status_code == 303, loaded.text
    location = loaded.headers["location"]
    assert location.endswith("#sweep")
    nb_id = int(re.search(r"/notebooks/(\d+)", location).group(1))
    nb = client.get(f"/api/notebooks/{nb_id}").json()
    assert nb["model"] == SPEC["model"] and nb["text"] == SPEC["document"]
    assert sorted(f["label"] for f in nb["fields"]) == sorted(f["label"] for f in SPEC["fields"])
    panel = unescape(client.get(f"/notebooks/{nb_id}/sweep").text)
    boxes = re.findall(r'<textarea id="sweep-values-\d+" name="values_\d+" rows="3">(.*?)</textarea>',
                       panel, re.S)
    assert sorted(len(b.splitlines()) for b in boxes) == [20, 20]  # each field's 20 values
    for f in SPEC["fields"]:
        assert "\n".join(f["values"]) in boxes
    assert f'value="{SPEC["question"]}"' in panel and 'value="0.95"' in panel
    checked = re.findall(r'name="strategies" value="(\w+)" checked', panel)
    assert sorted(checked) == sorted(SPEC["strategies"])
    again = client.post("/examples/sweeps/agent-status", follow_redirects=False)  # no second copy
    assert again.headers["location"] == location
    assert f"Open sweep example: {SPEC['title']}" in client.get("/").text
    assert client.post("/examples/sweeps/nope", follow_redirects=False).status_code == 422
