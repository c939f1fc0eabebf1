"""The example trajectory (issue 26 item 6): the support session of `bench/bench_trajectory.py`, at
least 12 turns each appending a tool result, the account status changing twice; its numbers are
stored (`bench/data/trajectory.json`, every turn of every strategy: hoist and auto included, and a
second run placing a skill at turn 4) and re-checked on the bundled model: the slow test runs the
first 12 turns of the example and the first 6 of the skill run again (`--check`) and requires the
same decisions, agreement, tokens and errata turn by turn, and KL within the script's factor. The
comparison itself is checked without a model: a moved decision, a KL off by more than the factor
and a token count each fail."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.bench_trajectory import (  # noqa: E402
    CHECK_KEYS,
    CHECK_SKILL_KEYS,
    CHECK_TURNS,
    DATA,
    KL_FACTOR,
    KL_FLOOR,
    SKILL,
    SKILL_AT,
    differences,
    turns,
)
from vocabulary import REFERENCE  # noqa: E402
from vocabulary.trajectories import turns_from_jsonl  # noqa: E402


def test_the_stored_example_is_a_support_session_with_two_status_changes() -> None:
    stored = json.loads(DATA.read_text())
    rows = turns_from_jsonl((REPO / "examples" / "support-trajectory.jsonl").read_text())
    assert len(rows) == stored["n_turns"] == len(stored["turns"]) >= 12
    assert all(r.append.strip() for r in rows)  # a tool result every turn
    assert [r.fields for r in rows if r.fields] == [{"status": "suspended"}, {"status": "active"}]
    assert [t["changed"] for t in stored["turns"] if t["changed"]] == [["status"], ["status"]]
    keys = list(stored["turns"][0]["results"])
    assert keys[0] == REFERENCE and {"hoist", "auto", *CHECK_KEYS} <= set(keys)
    for t in stored["turns"]:  # auto ran the stored policy, at that strategy's cost
        auto, policy = t["results"]["auto"], t["results"][stored["policy"]]
        assert (auto["decision"], auto["tokens_computed"]) == (policy["decision"], policy["tokens_computed"])
    skill = stored["skill"]["turns"]
    assert len(skill) >= CHECK_TURNS and set(CHECK_SKILL_KEYS) <= set(skill[0]["results"])
    placed = skill[SKILL_AT - 1]["results"]
    assert placed["stale"]["tokens_spliced"] > 0 and placed["recompute"]["tokens_spliced"] == 0
    assert stored["skill"]["name"] == SKILL and turns(stored["n_turns"]) == [
        {k: v for k, v in r.__dict__.items() if v and k in ("append", "fields")} for r in rows]


def test_a_moved_decision_token_or_kl_is_a_difference() -> None:
    stored = json.loads(DATA.read_text())["turns"][:4]
    fresh = copy.deepcopy(stored)
    assert differences(stored, fresh, "example") == []
    r = fresh[2]["results"]["erratum"]
    r["kl_to_recompute"] = max(r["kl_to_recompute"], KL_FLOOR) * KL_FACTOR * 1.5
    fresh[1]["results"]["stale"]["decision"] = "maybe"
    fresh[3]["results"]["hoist"]["tokens_computed"] += 1
    fresh[0]["results"]["in_place"]["agrees"] = not fresh[0]["results"]["in_place"]["agrees"]
    found = differences(stored, fresh, "example")
    assert any(f.startswith("example turn 3 erratum.kl_to_recompute") for f in found), found
    assert any(f.startswith("example turn 2 stale.decision: stored") for f in found), found
    assert any(f.startswith("example turn 4 hoist.tokens_computed") for f in found), found
    assert any(f.startswith("example in_place: agreed on") for f in found), found
    quiet = copy.deepcopy(stored)
    quiet[0]["results"]["prefix_reuse"]["kl_to_recompute"] = KL_FLOOR / 10  # float noise: equal
    assert differences(stored, quiet, "example") == []


@pytest.mark.slow
def test_the_stored_numbers_hold_on_the_bundled_model(data_dir) -> None:
    """The first 12 turns of the example (6 strategies) and 6 of its skill run (4), measured again:
    513 s of which 6 min of CPU, on 2 cores shared at a load of 5.5."""
    done = subprocess.run([sys.executable, "bench/bench_trajectory.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "KVNOTES_DATA": str(data_dir)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("as stored") == 2, done.stdout
    assert f"{CHECK_TURNS} turns x {len(CHECK_KEYS) + 1} strategies" in done.stdout
