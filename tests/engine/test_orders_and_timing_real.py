"""On the bundled smollm2-135m and the 1,000-token shipment log (examples/shipment-log.json): a
choice question's probabilities do not depend on the order its choices are listed, and two identical
runs' speed-up ranges overlap (a fact about how the range is built from paired timing rounds, not a
bound on any time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.engine import Field, Question, RunRequest, load

pytestmark = pytest.mark.slow

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "shipment-log.json").read_text())
DOCUMENT = EXAMPLE["document"]
START = DOCUMENT.index("Oslo")
FIELD = Field(START, START + 4, "Madrid", "destination")
QUESTION = "What is the destination of this shipment?"


@pytest.fixture(scope="module")
def smollm2(data_dir):
    return load("smollm2-135m", device="cpu", data_dir=data_dir)


@pytest.mark.parametrize("choices", [("Oslo", "Madrid"), ("Oslo", "Madrid", "Bergen")])
def test_recompute_s_probabilities_stay_within_0_05_when_the_choices_are_reversed(smollm2, choices):
    reads = []
    for listed in (choices, tuple(reversed(choices))):
        request = RunRequest(DOCUMENT, Question(QUESTION, listed), fields=(FIELD,), strategies=("recompute",))
        reads.append(smollm2.run(request).strategies["recompute"])
    forward, backward = reads
    for choice in choices:
        assert abs(forward.choice_probs[choice] - backward.choice_probs[choice]) <= 0.05, choice
    assert forward.decision == backward.decision and forward.order_bias == backward.order_bias
    if len(choices) == 2:  # the document's new value, either way (with Bergen offered it picks Bergen)
        assert forward.decision == "Madrid" and forward.order_bias is None


def test_two_identical_runs_give_overlapping_speed_up_ranges(smollm2):
    request = RunRequest(DOCUMENT, Question(QUESTION, ("Oslo", "Madrid")), fields=(FIELD,),
                         strategies=("recompute", "stale", "erratum"))
    first, second = (smollm2.run(request).strategies for _ in range(2))
    for name in ("stale", "erratum"):
        (lo1, hi1), (lo2, hi2) = first[name].speedup_range, second[name].speedup_range
        assert lo1 <= first[name].speedup <= hi1 and lo2 <= second[name].speedup <= hi2
        assert max(lo1, lo2) <= min(hi1, hi2), (name, first[name].speedup_range, second[name].speedup_range)
