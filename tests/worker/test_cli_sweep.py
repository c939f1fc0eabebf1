"""`kvnotes sweep`: many values of one field on a tiny model, in one process: the JSON has the API's
shape (per-strategy agreement with a 95% confidence-sequence interval containing it, changed-edit
agreement, cost share, standing and `needed`, frontier, policy, `stopped`), the document prefilled
once, a value equal to the old one skipped and counted, prefix_reuse agreeing on every determined
edit; values generated; with --stop-when-decided it stops at the first edit where the policy is
decided and says so; bad input (a value outside the choices, an empty or reversed range, more
values than KVNOTES_MAX_SWEEP_EDITS, a threshold outside (0, 1)) exits 2 with one line."""

from __future__ import annotations

import json

import pytest

from tests.worker.conftest import kvnotes

VALUES = "banned,active,closed,frozen,pending,locked"


def test_sweep_prints_the_api_shape(doc, tmp_path):
    out = kvnotes("sweep", "--model", "tiny-llama", "--document", str(doc[0]), "--field", "active",
                  "--label", "status", "--values", VALUES, "--question", "Can the user log in?",
                  "--choices", "yes,no", "--strategies", "recompute,prefix_reuse,erratum",
                  "--timed-edits", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["edits_done"], data["edits_skipped"], data["document_prefills"]) == (5, 1, 1)
    # the first 2 edits timed (each checks the decision-only reference), the other 3 decisions only
    assert (data["timed_edits"], data["edits_timed"]) == (2, 2) and data["exact_reference_kl"] <= 1e-6
    assert [all(t > 0 for t in e["ttft_ms"].values()) for e in data["edits"]] == [True] * 2 + [False] * 3
    # each edit's wall time against one prefill of the document, both measured in this run
    cost = data["cost"]
    assert len(cost["prefill_ms"]) == 2 and all(ms > 0 for ms in cost["prefill_ms"])
    assert (cost["timed"]["edits"], cost["decision_only"]["edits"]) == (2, 3)
    walls = [e["wall_ms"] for e in data["edits"]]
    prefill = sorted(cost["prefill_ms"])[0] / 2 + sorted(cost["prefill_ms"])[1] / 2
    assert cost["decision_only"]["median_prefills"] == pytest.approx(sorted(walls[2:])[1] / prefill)
    assert cost["decision_only"]["max_prefills"] == pytest.approx(max(walls[2:]) / prefill)
    assert list(data["strategies"]) == ["recompute", "prefix_reuse", "erratum", "stale"]
    for name, s in data["strategies"].items():
        assert s["determined"] == 5 and s["undetermined"] == 0, name
        lo, hi = s["agreement_ci95"]
        assert lo <= s["agreement"] <= hi
        assert set(s["changed"]) == {"value", "ci95", "agreed", "edits"}
    assert data["strategies"]["prefix_reuse"]["agreed"] == 5
    assert data["strategies"]["recompute"]["cost_share"] == 1.0
    assert data["strategies"]["erratum"]["cost_share"] > 0  # its erratum is longer than this record
    assert data["policy"]["strategy"] in data["strategies"] and data["policy"]["sentence"]
    assert {p["source"] for p in data["frontier"]} == {"this sweep", "the paper's 8B model"}
    values_file = tmp_path / "values.csv"
    values_file.write_text("status,expected\nbanned,no\nclosed,no\n")
    out = kvnotes("sweep", "--model", "tiny-llama", "--document", str(doc[0]), "--field", "active",
                  "--label", "status", "--values-file", str(values_file), "--question", "Status?",
                  "--strategies", "recompute", "--json")
    assert out.returncode == 0, out.stderr
    assert [e["values"] for e in json.loads(out.stdout)["edits"]] == [{"status": "banned"},
                                                                      {"status": "closed"}]


@pytest.mark.parametrize("extra, message", [
    (["--values", "banned,,closed"], "--values: value 2 is empty"),
    (["--values", "active"], "every value (1) equals the field's old value"),
    (["--values", "a", "--values-file", "x.txt"], "give the values one way"),
    (["--values", "a", "--threshold", "1.5"], "--threshold must be between 0 and 1"),
    (["--values", "a", "--threshold", "0"], "--threshold must be between 0 and 1"),
    (["--values", "banned,closed", "--choices", "active,banned"],
     "value 2, 'closed', is not among the choices (active, banned)"),
    (["--generate", "integers", "--count", "3", "--from", "9", "--to", "1"],
     "--generate integers: the range is reversed: start 9 is after end 1"),
    (["--generate", "dates", "--count", "3", "--from", "2026-01-01", "--to", "2026-01-01"],
     "the range is empty: start and end are both 2026-01-01"),
    (["--generate", "integers", "--count", "5000", "--from", "1", "--to", "9000"],
     "5000 values asked; a sweep takes at most"),
    (["--values", "a", "--timed-edits", "-1"], "--timed-edits must be 0 or more"),
])
def test_sweep_bad_input_exits_2(doc, extra, message):
    out = kvnotes("sweep", "--model", "tiny-llama", "--document", str(doc[0]), "--field", "active",
                  "--question", "q", *extra)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_sweep_generates_values_and_stops_when_decided(doc):
    """Generated values 1, 3, 5, 7; with only prefix_reuse asked, the exact prefix_reuse qualifies
    from the first edit and stale (the floor, which never follows a changed edit) is the only cheaper
    candidate, below by construction: the policy is decided after one edit, and the sweep stops."""
    out = kvnotes("sweep", "--model", "tiny-llama", "--document", str(doc[0]), "--field", "active",
                  "--label", "status", "--generate", "integers", "--count", "4", "--from", "1", "--to", "7",
                  "--question", "Status?", "--choices", "yes,no", "--strategies", "recompute,prefix_reuse",
                  "--threshold", "0.3", "--stop-when-decided", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["edits_total"] == 4 and data["stop_when_decided"] is True
    assert (data["stopped"], data["edits_done"]) == ("decided", 1)
    assert [e["values"] for e in data["edits"]] == [{"status": "1"}]
    assert data["policy"] == {**data["policy"], "strategy": "prefix_reuse", "decided": True}
    assert data["strategies"]["prefix_reuse"]["needed"] == 0
    assert data["strategies"]["stale"]["needed"] is None
    assert "confidence sequence" in data["interval"]
    out = kvnotes("sweep", "--model", "tiny-llama", "--document", str(doc[0]), "--field", "active",
                  "--label", "status", "--values", "banned,closed", "--question", "Status?",
                  "--choices", "active,banned", "--extend-choices", "--strategies", "recompute",
                  "--threshold", "0.3", "--stop-when-decided")
    assert out.returncode == 0, out.stderr
    assert "choices extended with closed" in out.stdout
    assert "a timed edit cost" in out.stdout and "one prefill of the document (median of 1;" in out.stdout
