"""The run form and the API schema read the strategy descriptors: in the form every strategy once,
with its help and what it recomputes as the tooltip, hoist offered but not ticked, recompute always
run; in the schema the same names."""

from __future__ import annotations

import re

from markupsafe import escape

from tests.web.conftest import new_notebook
from vocabulary import DEFAULT_STRATEGIES, EDIT_INFO


def test_the_run_form_lists_every_descriptor_and_ticks_only_the_defaults(make_client) -> None:
    client = make_client()
    page = client.get(f"/notebooks/{new_notebook(client)}").text
    ticked = re.findall(r'name="strategies" value="([a-z_]+)" checked', page)
    offered = re.findall(r'name="strategies" value="([a-z_]+)"', page)
    assert offered == list(EDIT_INFO)  # recompute as a hidden input, then every other one in order
    assert ticked == [name for name in DEFAULT_STRATEGIES if name != "recompute"] and "hoist" not in ticked
    for info in EDIT_INFO.values():
        assert f'title="{escape(info.help)}. Recomputes: {escape(info.recomputes)}"' in page


def test_the_api_schema_names_the_same_strategies(make_client) -> None:
    schema = make_client().get("/openapi.json").json()["components"]["schemas"]
    items = schema["RunCreate"]["properties"]["strategies"]["items"]
    assert items["enum"] == list(EDIT_INFO)
    result = schema["StrategyResultOut"]["properties"]
    assert {"picked", "ttft_spread_ms", "edit_followed"} <= set(result)
