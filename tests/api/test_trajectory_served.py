"""Done when (issue 26), through the API of `kvnotes serve` with a real worker: a 12-turn
trajectory (a tool result appended every turn, the account status changed twice) returns per turn
and strategy the decision, agreement, KL and cumulative TTFT; prefix_reuse agrees with recompute on
every turn with KL <= 1e-6; erratum and field_erratum compute fewer cumulative tokens than recompute;
the summary carries agreement with its Wilson interval, cumulative TTFT and speed-up, and max KL.
The worker holds the tiny random llama (float32 on the CPU)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ServedApp, api_call

pytestmark = pytest.mark.slow

RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          "Only accounts whose status is active may log in.\n")
MODEL = "tiny-llama"
STRATEGIES = ["recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum",
              "erratum.one_per_field", "field_erratum.one_per_field"]


def turns() -> list[dict]:
    out = []
    for i in range(12):
        turn: dict = {"append": f"\n[tool] lookup #{i + 1}: {2 + i} tickets open, last login {i + 1}h ago."}
        if i == 3:
            turn["fields"] = {"status": "suspended"}
        if i == 8:
            turn["fields"] = {"status": "active"}
        out.append(turn)
    return out


def test_a_served_12_turn_trajectory(tmp_path: Path) -> None:
    with ServedApp(tmp_path, MODEL, worker=True) as server:
        api = f"{server.url}/api"
        nb = api_call(f"{api}/notebooks", "POST", {"title": "agent", "model": MODEL, "text": RECORD})["id"]
        start = RECORD.index("active")
        api_call(f"{api}/notebooks/{nb}/fields", "POST",
              {"start": start, "end": start + 6, "new_value": "suspended", "label": "status"})
        t = api_call(f"{api}/notebooks/{nb}/trajectories", "POST",
                  {"turns": turns(), "strategies": STRATEGIES, "question": "Can Dana log in?",
                   "choices": ["yes", "no"]})
        assert t["status"] == "queued" and t["turns_total"] == 12
        deadline = time.time() + 900
        while t["status"] in ("queued", "running") and time.time() < deadline:
            time.sleep(2)
            t = api_call(f"{api}/trajectories/{t['id']}")
        assert t["status"] == "succeeded", t.get("error")
        with urllib.request.urlopen(f"{server.url}/trajectories/{t['id']}", timeout=60) as response:
            page = response.read().decode()
        csv_url = f"{server.url}/trajectories/{t['id']}/export.csv"
        with urllib.request.urlopen(csv_url, timeout=60) as response:
            rows = response.read().decode().splitlines()
    assert "prefix_reuse agreed on" in page and page.count("<svg") >= 2
    assert rows[0].startswith("trajectory_id,turn,strategy") and len(rows) == 1 + 12 * len(STRATEGIES)
    assert t["turns_done"] == 12 and len(t["turns"]) == 12
    assert [turn["changed"] for turn in t["turns"]][3] == ["status"]
    assert [turn["changed"] for turn in t["turns"]][8] == ["status"]
    for turn in t["turns"]:
        assert set(turn["results"]) == set(STRATEGIES)
        for name, r in turn["results"].items():
            for key in ("decision", "agrees", "edit_followed", "kl_to_recompute", "logit_cosine",
                        "tokens_computed", "ttft_ms", "cumulative_ttft_ms", "cache_tokens"):
                assert key in r, (name, key)
            assert r["cumulative_ttft_ms"] >= r["ttft_ms"] > 0
        reuse = turn["results"]["prefix_reuse"]
        assert reuse["agrees"] and reuse["kl_to_recompute"] <= 1e-6, (turn["index"], reuse)
    last = t["turns"][-1]["results"]
    for name in ("erratum", "field_erratum", "erratum.one_per_field", "field_erratum.one_per_field"):
        assert last[name]["cumulative_tokens"] < last["recompute"]["cumulative_tokens"], name
    assert last["erratum"]["errata"] == 2 and last["erratum.one_per_field"]["errata"] == 1
    s = t["summary"]
    assert s["prefix_reuse"]["agreement"] == 1.0 and s["prefix_reuse"]["max_kl"] <= 1e-6
    for name, summary in s.items():
        lo, hi = summary["agreement_ci95"]
        assert lo <= summary["agreement"] <= hi, name
        assert summary["cumulative_ttft_ms"] == pytest.approx(last[name]["cumulative_ttft_ms"])
        assert summary["cumulative_speedup"] > 0
    moved = sum(not turn["results"]["stale"]["agrees"] for turn in t["turns"])  # changed the decision
    assert (s["prefix_reuse"]["changed_turns"], s["prefix_reuse"]["changed_agreed"]) == (moved, moved)
    assert s["stale"]["changed_agreed"] == 0 and "12 of 12 turns" in t["verdicts"]["prefix_reuse"]
    print(json.dumps({k: {"agreement": v["agreement"], "max_kl": v["max_kl"],
                          "cumulative_tokens": v["cumulative_tokens"],
                          "cumulative_speedup": v["cumulative_speedup"]} for k, v in s.items()}))
