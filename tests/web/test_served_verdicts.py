"""Done when, through the API of a served kvnotes with a real worker on the bundled model: a
free-answer read-back run carries `edit_followed` that agrees with the values each answer names,
`ttft_spread_ms` around its median, and `attention_regions` summing to 1 for every strategy."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import REPO, ServedApp, api_call, api_notebook
from vocabulary.regions import REGIONS
from vocabulary.verdicts import edit_followed, words

pytestmark = pytest.mark.slow

RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          "Only accounts whose status is active may log in.")


def test_a_served_read_back_run_knows_the_edit(tmp_path: Path) -> None:
    from worker.engine.models import ensure_converted

    data = REPO / "var" / "test-data"  # the bundled model, converted once (here when this test runs first)
    (tmp_path / "models").symlink_to(ensure_converted("smollm2-135m", data).parent)
    with ServedApp(tmp_path, "smollm2-135m", worker=True) as server:
        api = f"{server.url}/api"
        nb = api_notebook(api, RECORD, "access", ("active", "suspended", "status"))
        run = api_call(f"{api}/notebooks/{nb}/runs", "POST",
                    {"question": "What is the account status?",
                     "strategies": ["recompute", "stale", "field_erratum"]})
        deadline = time.time() + 900
        while run["status"] in ("queued", "running") and time.time() < deadline:
            time.sleep(2)
            run = api_call(f"{api}/runs/{run['id']}")
        assert run["status"] == "succeeded", run.get("error")
    results, regions = run["results"], run["attention_regions"]
    assert set(results) == set(regions) == {"recompute", "stale", "field_erratum"}
    for name, result in results.items():
        said = words(result["decision"])
        names_new, names_old = "suspended" in said, "active" in said
        expected = {(True, False): "new", (False, True): "old",
                    (True, True): "both"}.get((names_new, names_old), "neither")
        assert result["edit_followed"] == expected == edit_followed(result["decision"],
                                                                    ["active"], ["suspended"])
        low, high = result["ttft_spread_ms"]
        assert 0 < low <= result["ttft_ms"] <= high, name
        assert list(regions[name]) == list(REGIONS)
        assert sum(regions[name].values()) == pytest.approx(1.0, abs=0.01), name
        assert regions[name]["field"] > 0 and regions[name]["question"] > 0, name
    assert regions["field_erratum"]["errata"] > 0 and regions["stale"]["errata"] == 0
    assert results["stale"]["edit_followed"] == "old"  # the stale notes still read "active" (measured)
