"""`auto` with a policy a notebook adopted from a sweep: it runs only the adopted strategy, so its
decision and its tokens computed are exactly that strategy's, and its cost is not every probe's."""

from __future__ import annotations

import pytest

from vocabulary import AUTO_CANDIDATES, by_role
from worker.engine import Field, Question, RunRequest, load
from worker.engine.run import run
from worker.engine.strategies import EDITS
from worker.engine.types import EngineError

DOC = "Account record.\nstatus: active\nowner: Ada Lovelace\nOnly active accounts may log in.\n"
QUESTION = Question("Can this user log in?", ("yes", "no"))
AUTO = by_role("composite")


def _request(strategies: tuple[str, ...], policy: str | None) -> RunRequest:
    start = DOC.index("active")
    field = Field(start, start + 6, "suspended", "status")
    return RunRequest(document=DOC, question=QUESTION, fields=(field,), strategies=strategies, policy=policy)


@pytest.mark.parametrize("policy", AUTO_CANDIDATES[1:])  # erratum, in_place: not auto's cheapest probe
def test_auto_with_an_adopted_policy_computes_exactly_that_strategys_tokens_and_decision(policy):
    eng = load("tiny-qwen3")
    report = run(eng, _request((AUTO, policy), policy))
    auto, adopted = report.strategies[AUTO], report.strategies[policy]
    assert auto.picked == policy
    assert auto.tokens_computed == adopted.tokens_computed > 0
    assert auto.decision == adopted.decision
    assert auto.decision_matches_recompute == adopted.decision_matches_recompute
    # its cost is the adopted strategy's own timings, not a sum over probes
    assert (auto.ttft_ms, auto.latency_ms, auto.ttft_spread_ms) == \
        (adopted.ttft_ms, adopted.latency_ms, adopted.ttft_spread_ms)
    # and its speed-up over recompute is the adopted strategy's, paired round by round (issue 51 item 4:
    # auto's "noisy 0.8–1.3×" beside in_place's 3.4× was the adopted prefix_reuse's, not a bug)
    assert (auto.speedup, auto.speedup_range) == (adopted.speedup, adopted.speedup_range)
    assert auto.speedup is not None


def test_auto_with_an_adopted_policy_measures_only_that_strategy():
    built = EDITS.build([by_role("reference"), AUTO])
    built[AUTO].follow(AUTO_CANDIDATES[1])
    assert list(EDITS.runners(built)) == [by_role("reference"), AUTO_CANDIDATES[1]]


def test_a_policy_that_names_no_plain_strategy_is_refused():
    eng = load("tiny-qwen3")
    for bad in (AUTO, "nonsense"):
        with pytest.raises(EngineError, match="adopted policy"):
            run(eng, _request((AUTO,), bad))
