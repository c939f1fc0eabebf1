"""`kvnotes trajectory`: a document and JSONL turns on a tiny model, in one process: the JSON has
the API's shape (per turn every strategy's decision, agreement, KL, TTFT and cumulative TTFT; per
strategy the summary with a Wilson interval; verdicts), prefix_reuse agrees on every turn with KL
<= 1e-6, erratum computes fewer cumulative tokens than recompute; hoist, auto (its --policy) and a
turn placing a --skill run too; bad input exits 2 with one line."""

from __future__ import annotations

import json

import pytest

from tests.worker.conftest import kvnotes

TURNS = [{"append": f"\nTool result {i}: {i + 2} open tickets."} for i in range(5)]
TURNS[1]["fields"] = {"status": "suspended"}
TURNS[3]["fields"] = {"status": "active"}


def test_trajectory_prints_the_api_shape(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("Account record. status: active. Only active accounts may log in.\n")
    turns = tmp_path / "turns.jsonl"
    turns.write_text("\n".join(json.dumps(t) for t in TURNS) + "\n")
    out = kvnotes("trajectory", "--model", "tiny-llama", "--document", str(doc), "--turns", str(turns),
                  "--question", "Can the user log in?", "--choices", "yes,no",
                  "--strategies", "prefix_reuse,erratum,erratum.one_per_field", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["status"] == "succeeded" and len(data["turns"]) == 5
    assert [t["changed"] for t in data["turns"]] == [[], ["status"], [], ["status"], []]
    for t in data["turns"]:
        assert list(t["results"]) == ["recompute", "prefix_reuse", "erratum", "erratum.one_per_field"]
        reuse = t["results"]["prefix_reuse"]
        assert reuse["agrees"] and reuse["kl_to_recompute"] <= 1e-6
    last = data["turns"][-1]["results"]
    assert last["erratum"]["cumulative_tokens"] < last["recompute"]["cumulative_tokens"]
    assert (last["erratum"]["errata"], last["erratum.one_per_field"]["errata"]) == (2, 1)
    s = data["summary"]["prefix_reuse"]
    lo, hi = s["agreement_ci95"]
    assert s["agreement"] == 1.0 and lo <= 1.0 <= hi and s["max_kl"] <= 1e-6
    assert data["verdicts"]["prefix_reuse"].startswith("over 5 turns prefix_reuse agreed on 5")


def test_hoist_auto_and_a_skill_turn(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("Account record.\nstatus: active\nOnly active accounts may log in.\n")
    skill = tmp_path / "refunds.txt"
    skill.write_text("Refund policy: refunds go only to active accounts.\n")
    rows = [dict(t) for t in TURNS]
    rows[2]["skill"] = "refunds"
    turns = tmp_path / "turns.jsonl"
    turns.write_text("\n".join(json.dumps(t) for t in rows) + "\n")
    out = kvnotes("trajectory", "--model", "tiny-llama", "--document", str(doc), "--turns", str(turns),
                  "--question", "Can the user log in?", "--choices", "yes,no", "--skill", f"refunds={skill}",
                  "--strategies", "erratum,hoist,auto", "--policy", "erratum", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for t in data["turns"]:
        r = t["results"]
        assert list(r) == ["recompute", "erratum", "hoist", "auto"]
        assert {k: r["auto"][k] for k in ("decision", "tokens_computed", "cache_tokens", "errata")} == \
            {k: r["erratum"][k] for k in ("decision", "tokens_computed", "cache_tokens", "errata")}
        spliced = {k: v["tokens_spliced"] for k, v in r.items()}
        if t["index"] == 2:
            assert spliced["recompute"] == 0 and spliced["erratum"] == spliced["hoist"] == spliced["auto"] > 5
        else:
            assert set(spliced.values()) == {0}
    assert data["turns"][-1]["results"]["erratum"]["errata"] == 2
    text = kvnotes("trajectory", "--model", "tiny-llama", "--document", str(doc), "--turns", str(turns),
                   "--question", "Can the user log in?", "--skill", f"refunds={skill}",
                   "--strategies", "hoist,auto", "--policy", "stale")
    assert text.returncode == 0, text.stderr
    assert "auto applied the adopted policy: stale" in text.stdout
    assert "turn 3 placed the skill 'refunds'" in text.stdout


@pytest.mark.parametrize("turns, extra, message", [
    ('{"append": "x"}\nnot json\n', [], "line 2 is not JSON"),
    ('{"fields": {"tier": "gold"}}\n', [], "a turn changes 'tier', which the document does not show"),
    ('{"append": "x"}\n', ["--strategies", "nonesuch"], "unknown trajectory strategies: 'nonesuch'"),
    ('{"append": "x"}\n', ["--strategies", "auto"], "auto in a trajectory applies an adopted sweep policy"),
    ('{"append": "x"}\n', ["--policy", "auto"], "--policy 'auto': name a strategy"),
    ('{"append": "x"}\n{"skill": "refunds"}\n', [], "turn 2 places a skill 'refunds' that no --skill gives"),
    ('{"skill": 3}\n', [], "line 1: skill must be a skill's name"),
    ('{"append": "x"}\n', ["--field", "status=closed"], "--field status: 'closed' is not in the document"),
    ('{"append": "x"}\n{}\n', [], "turn 2 is empty"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, turns, extra, message):
    doc = tmp_path / "doc.txt"
    doc.write_text("Account record. status: active.\n")
    path = tmp_path / "turns.jsonl"
    path.write_text(turns)
    out = kvnotes("trajectory", "--model", "tiny-llama", "--document", str(doc), "--turns", str(path),
                  "--question", "Can the user log in?", *extra)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
