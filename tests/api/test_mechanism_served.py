"""Done when (issue 27), through the API of a served kvnotes with a real worker on the bundled model:
a run asked with `"mechanism": true` carries knockout rows each with its random control,
selective@K curves per ranking with K* (or null), and a logit lens per strategy as long as the
model has layers; the run page draws all three."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, ServedApp, api_call, api_notebook

pytestmark = pytest.mark.slow

RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\nRegion: north\n\n"
          "Only accounts whose status is active may log in; suspended accounts are refused.")
STRATEGIES = ["recompute", "stale", "in_place", "field_erratum"]


def test_a_served_run_carries_and_draws_the_mechanism(tmp_path: Path) -> None:
    from worker.engine.models import ensure_converted

    data = REPO / "var" / "test-data"  # the bundled model, converted once (here when this test runs first)
    (tmp_path / "models").symlink_to(ensure_converted("smollm2-135m", data).parent)
    with ServedApp(tmp_path, "smollm2-135m", worker=True) as server:
        api = f"{server.url}/api"
        nb = api_notebook(api, RECORD, "access", ("active", "suspended", "status"))
        run = api_call(f"{api}/notebooks/{nb}/runs", "POST",
                    {"question": "Can this account log in?", "choices": ["yes", "no"],
                     "strategies": STRATEGIES, "mechanism": True})
        assert run["snapshot"]["mechanism"] is True
        deadline = time.time() + 900
        while run["status"] in ("queued", "running") and time.time() < deadline:
            time.sleep(2)
            run = api_call(f"{api}/runs/{run['id']}")
        assert run["status"] == "succeeded", run.get("error")
        with urllib.request.urlopen(f"{server.url}/runs/{run['id']}", timeout=60) as response:
            html = response.read().decode()
    m = run["mechanism"]
    measured = [row for row in m["knockout"] if row["reading"] is not None]
    assert len(measured) >= 6 and all(row["control"]["draws"] == 5 for row in measured)
    assert {row["strategy"] for row in m["knockout"]} == {"recompute", m["shown"]}
    assert {(row["region"], row["layers"]) for row in measured if row["strategy"] == "recompute"} >= {
        ("field", "all"), ("downstream_top10", "all"), ("downstream_top25", "all"),
        ("downstream_top8", "all"), ("sink", "all"), ("downstream_top25", "early"),
        ("downstream_top25", "middle"), ("downstream_top25", "late")}
    errata = [r for r in m["knockout"] if r["strategy"] == "recompute" and r["region"] == "errata"]
    assert errata[0]["reading"] is None and errata[0]["note"] == "no errata in these notes"
    curves = {c["ranking"]: c for c in m["selective_k"]}
    skipped = bool(m["selective_skipped"])  # in_place already gave recompute's decision: no sweep
    assert skipped or list(curves) == ["notes_map", "attention", "kv_deviation", "random"]
    assert skipped or (curves["notes_map"]["points"] == [] and "not measured" in curves["notes_map"]["note"])
    assert not skipped or (curves == {} and "the sweep was skipped" in html)
    for name in ("attention", "kv_deviation", "random") if not skipped else ():
        ks = [p["k"] for p in curves[name]["points"]]
        assert ks[0] == 0 and ks[-1] == m["downstream"] and ks == sorted(ks)
        assert curves[name]["points"][-1]["reading"]["kl"] < 1e-3  # every downstream token: prefix_reuse
        star = curves[name]["k_star"]
        assert star is None or all(p["agrees"] for p in curves[name]["points"] if p["k"] >= star)
    assert set(m["logit_lens"]) == set(STRATEGIES)
    assert all(len(v) == 30 for v in m["logit_lens"].values())  # smollm2-135m has 30 layers
    assert set(m["costs"]) == {"knockout", "selective_k", "logit_lens"}
    # the page draws the three views
    assert html.count('class="knockout-row') == len(m["knockout"])
    assert len(re.findall(r'<svg[^>]*class="k-curve"', html)) == (0 if skipped else 3)
    assert len(re.findall(r'<div class="lens-strip"', html)) == len(STRATEGIES)
    assert "no errata in these notes" in html and (skipped or "not measured on this run" in html)
