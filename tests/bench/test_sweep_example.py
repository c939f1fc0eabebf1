"""The example sweep (`examples/sweeps/agent-status.json`): an agent prompt with a timestamp and an
account-status field, at least 20 values each, a question that reads the status back; its stored
measurement (`agent-status.measured.json`, written by scripts/measure_sweep_example.py) covers every
value, and every stored statistic is what `vocabulary.sweeps` computes from the stored decisions.
The slow test runs the first edits of each field again on the bundled model and compares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vocabulary.sweeps import EditRecord, Outcome, sweep_stats

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "sweeps" / "agent-status.json"
MEASURED = SPEC.with_name("agent-status.measured.json")


def test_the_example_has_two_fields_of_20_values_and_reads_the_status_back() -> None:
    spec = json.loads(SPEC.read_text())
    labels = [f["label"] for f in spec["fields"]]
    assert labels == ["current time", "account status"]
    for field in spec["fields"]:
        assert field["find"] in spec["document"] and len(set(field["values"])) >= 20
        assert field["find"] not in field["values"]
    assert "status" in spec["question"] and spec["choices"] == []


def test_the_stored_statistics_follow_from_the_stored_decisions() -> None:
    spec = json.loads(SPEC.read_text())
    assert MEASURED.exists(), "run .venv/bin/python scripts/measure_sweep_example.py"
    measured = json.loads(MEASURED.read_text())
    assert measured["model"] == spec["model"]
    for field, stored in zip(spec["fields"], measured["fields"], strict=True):
        assert [e["value"] for e in stored["edits"]] == field["values"]
        assert stored["document_prefills"] == 1
        records = [EditRecord(position=i, group=field["label"], values={field["label"]: e["value"]},
                              expected=None, run_id=0,
                              outcomes={n: Outcome(decision=d, followed=e["edit_followed"][n], kl=0.0,
                                                   tokens=0, prefix_cache_share=0.0, ttft_ms=0.0)
                                        for n, d in e["decisions"].items()})
                   for i, e in enumerate(stored["edits"])]
        stats = sweep_stats(records, spec["strategies"], False, spec["threshold"])
        for name, s in stats.strategies.items():
            kept = stored["strategies"][name]
            assert (s.agreement.k, s.agreement.n, s.undetermined) == \
                (kept["agreed"], kept["determined"], kept["undetermined"]), (field["label"], name)
            assert (s.changed.k, s.changed.n) == (kept["changed"]["agreed"], kept["changed"]["edits"])
        exact = stored["strategies"]["prefix_reuse"]
        assert exact["agreed"] == exact["determined"]


@pytest.mark.slow
def test_the_stored_decisions_hold_on_the_bundled_model() -> None:
    done = subprocess.run([sys.executable, "scripts/measure_sweep_example.py", "--check", "--edits", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: 4 edits checked" in done.stdout
