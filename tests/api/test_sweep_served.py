"""Done when (issue 23), through the API of a served kvnotes with a real worker: a sweep of 20
status values returns, per strategy, agreement with a Wilson interval that contains it,
changed-edit agreement, cost share, a frontier and a policy; its CSV has one row per edit and
strategy; prefix_reuse agrees with recompute on every determined edit; the document is prefilled
once (one worker); each edit opens as an ordinary run page; the sweep page draws it.

The worker holds the tiny random llama and the question has choices: on this shared 2-core
machine one free-answer edit of the bundled model took 9 minutes under load."""

from __future__ import annotations

import csv
import io
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ServedApp, api_call

pytestmark = pytest.mark.slow

RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          "Only accounts whose status is active may log in.")
VALUES = ["suspended", "banned", "closed", "frozen", "pending", "locked", "expired", "disabled",
          "blocked", "archived", "deleted", "restricted", "dormant", "cancelled", "terminated", "revoked",
          "paused", "flagged", "verified", "trial"]
STRATEGIES = ["recompute", "prefix_reuse", "stale", "in_place", "erratum"]
MODEL = "tiny-llama"


def _text(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.status, response.read().decode()


def test_a_served_sweep_of_20_values(tmp_path: Path) -> None:
    with ServedApp(tmp_path, MODEL, worker=True) as server:
        api = f"{server.url}/api"
        nb = api_call(f"{api}/notebooks", "POST", {"title": "access", "model": MODEL, "text": RECORD})["id"]
        start = RECORD.index("active")
        api_call(f"{api}/notebooks/{nb}/fields", "POST",
              {"start": start, "end": start + 6, "new_value": "suspended", "label": "status"})
        sweep = api_call(f"{api}/notebooks/{nb}/sweeps", "POST",
                      {"values": {"status": VALUES}, "question": "Can Dana log in?",
                       "choices": ["yes", "no"], "strategies": STRATEGIES})
        assert sweep["edits_total"] == 20 and sweep["status"] == "queued"
        deadline = time.time() + 1500
        while sweep["status"] in ("queued", "running") and time.time() < deadline:
            time.sleep(3)
            sweep = api_call(f"{api}/sweeps/{sweep['id']}")
        assert sweep["status"] == "succeeded", sweep.get("error")
        csv_status, csv_text = _text(f"{server.url}/sweeps/{sweep['id']}/export.csv")
        page_status, page = _text(f"{server.url}/sweeps/{sweep['id']}")
        run_status, _ = _text(f"{server.url}/runs/{sweep['edits'][0]['run_id']}")
        strict = api_call(f"{api}/sweeps/{sweep['id']}?threshold=0.5")
    assert sweep["edits_done"] == 20 and sweep["document_prefills"] == 1
    strategies = sweep["strategies"]
    assert set(strategies) == set(STRATEGIES)
    for name, s in strategies.items():
        assert s["determined"] == 20 and s["undetermined"] == 0, name  # choices: every edit determined
        lo, hi = s["agreement_ci95"]
        assert lo <= s["agreement"] <= hi, name
        assert s["agreement"] == pytest.approx(s["agreed"] / s["determined"])
        assert 0.0 <= s["cost_share"] <= 1.0 and s["changed"]["edits"] >= 0, name
    assert strategies["recompute"]["cost_share"] == 1.0
    assert strategies["stale"]["cost_share"] == 0.0
    pr = strategies["prefix_reuse"]
    assert pr["agreed"] == pr["determined"]  # exact: agrees on every determined edit
    moved = strategies["recompute"]["changed"]["edits"]  # the edits that moved recompute's decision
    assert all(s["changed"]["edits"] == moved for s in strategies.values())
    assert strategies["stale"]["changed"]["agreed"] == 0
    assert strategies["recompute"]["changed"]["agreed"] == moved
    labels = {(p["label"], p["source"]) for p in sweep["frontier"]}
    assert {(n, "this sweep") for n in STRATEGIES} <= labels
    assert ("erratum", "the paper's 8B model") in labels and ("in-place", "the paper's 8B model") in labels
    policy = sweep["policy"]
    assert policy["strategy"] in STRATEGIES and policy["threshold"] == 0.95 and policy["sentence"]
    assert strict["policy"]["threshold"] == 0.5
    # the CSV: a header, then one row per edit and strategy
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert csv_status == 200 and len(rows) == 20 * len(STRATEGIES)
    assert {(r["run_id"], r["strategy"]) for r in rows} == \
        {(str(e["run_id"]), n) for e in sweep["edits"] for n in STRATEGIES}
    assert page_status == 200 and "20 of 20 edits" in page and "<svg" in page
    assert f"<code>{policy['strategy']}</code>" in page and "data-policy" in page
    assert run_status == 200
