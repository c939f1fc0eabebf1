"""The home page's sweep example (`examples/sweeps/destination-city.json`): a record whose first
line, the destination city, the question reads back; 45 new cities; threshold 0.80, stop when
decided. Its stored measurement (`destination-city.measured.json`, written by
scripts/measure_sweep_example.py on the engine's sweep path, as offered) decided in_place, cheaper
than prefix_reuse, within 10 minutes, and every stored statistic is what `vocabulary.sweeps`
computes from the stored decisions. The slow test runs the example again as offered and checks that
it decides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vocabulary.confidence import more_needed
from vocabulary.sweeps import EditRecord, Outcome, sweep_stats

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "sweeps" / "destination-city.json"
MEASURED = SPEC.with_name("destination-city.measured.json")


def _records(run: dict, label: str) -> list[EditRecord]:
    """The stored edits as a sweep's records; each strategy's tokens in proportion to its stored cost
    share (the policy ranks candidates by cost)."""
    tokens = {n: round(1000 * s["cost_share"]) for n, s in run["strategies"].items()}
    return [EditRecord(position=i, group=label, values={label: e["value"]}, expected=None, run_id=0,
                       outcomes={n: Outcome(decision=d, followed=e["edit_followed"][n], kl=0.0,
                                            tokens=tokens[n], prefix_cache_share=0.0, ttft_ms=0.0)
                                 for n, d in e["decisions"].items()})
            for i, e in enumerate(run["edits"])]


def test_the_example_reads_one_field_back_with_enough_values_to_decide() -> None:
    spec = json.loads(SPEC.read_text())
    (field,) = spec["fields"]
    assert spec["document"].startswith("Destination city: " + field["find"])  # the field first
    assert "destination city" in spec["question"] and spec["choices"] == []
    assert len(set(field["values"])) == len(field["values"]) and field["find"] not in field["values"]
    needed = more_needed([(0, 0)], spec["threshold"])
    assert needed == 29 and len(field["values"]) >= needed + 10  # a margin for undetermined edits
    assert more_needed([(0, 0)], 0.95) > len(field["values"])  # why not 0.95: it could not decide
    assert spec["stop_when_decided"] and spec["expected_policy"] == "in_place"


def test_the_stored_run_decided_a_policy_cheaper_than_prefix_reuse_within_10_minutes() -> None:
    spec = json.loads(SPEC.read_text())
    measured = json.loads(MEASURED.read_text())
    run = measured["models"][spec["model"]]
    assert run["stopped"] == "decided" and run["policy"]["decided"]
    assert run["policy"]["strategy"] == spec["expected_policy"]
    shares = {n: s["cost_share"] for n, s in run["strategies"].items()}
    assert shares["in_place"] < shares["prefix_reuse"] / 10
    assert run["seconds"] < 600
    # the statistics follow from the stored decisions, and so does the decision (at this edit, not before)
    label = spec["fields"][0]["label"]
    records = _records(run, label)
    stats = sweep_stats(records, spec["strategies"], False, spec["threshold"])
    for name, s in stats.strategies.items():
        kept = run["strategies"][name]
        assert (s.agreement.k, s.agreement.n, s.undetermined) == \
            (kept["agreed"], kept["determined"], kept["undetermined"]), name
        assert (s.changed.k, s.changed.n) == (kept["changed"]["agreed"], kept["changed"]["edits"])
    assert stats.decided and stats.policy.strategy == "in_place"
    assert not sweep_stats(records[:-1], spec["strategies"], False, spec["threshold"]).decided
    assert stats.strategies["in_place"].changed.n == more_needed([(0, 0)], spec["threshold"])
    doc = (REPO / "docs" / "sweep-example.md").read_text()
    assert f"{run['edits_done']} of {run['edits_total']} edits in **{run['seconds']:.0f} s**" in doc


@pytest.mark.slow
def test_the_example_as_offered_decides_on_its_model(data_dir: Path) -> None:
    """The example, as the card offers it (its values, strategies, threshold, stop when decided), on
    the engine's sweep path: it decides in_place, cheaper than prefix_reuse, with the same decisions
    as stored. No time is asserted (a shared machine)."""
    from commands.sweep import run_sweep
    from worker.engine import Question, load

    spec = json.loads(SPEC.read_text())
    (field,) = spec["fields"]
    os.environ.setdefault("KVNOTES_DATA", str(data_dir))
    eng = load(spec["model"], device="cpu", data_dir=data_dir)
    question = Question(spec["question"], (), max_new_tokens=spec["max_new_tokens"])
    # decision-only edits (no paired timing rounds: they give the speed-ups, not the decisions), so the
    # test costs about 29 decision-only edits
    result = run_sweep(eng, spec["document"], field["find"], field["label"], field["values"], question,
                       spec["strategies"], spec["threshold"], stop_when_decided=True, timed_edits=0)
    assert result["stopped"] == "decided" and result["policy"]["decided"], result["policy"]
    assert result["policy"]["strategy"] == "in_place"
    shares = {n: s["cost_share"] for n, s in result["strategies"].items()}
    assert shares["in_place"] < shares["prefix_reuse"]
    stored = json.loads(MEASURED.read_text())["models"][spec["model"]]
    assert [e["edit_followed"] for e in result["edits"]] == [e["edit_followed"] for e in stored["edits"]]
