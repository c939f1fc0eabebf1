"""The mechanism views at the deciding token (issue 43, item 2): on a free answer they read the
token where recompute's answer first names a value, recompute's answer teacher-forced up to there,
not the first answer token ("The", which stale gives too). Where the answer names no value, the
first token where recompute's and stale's answers differ, labelled."""

from __future__ import annotations

import pytest

from vocabulary.agreement import deciding_token, value_token
from worker.engine import Field, load

ACCOUNT = ("Account record\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n"
           "Only accounts whose status is active may log in; suspended accounts are refused.\n")


def test_the_deciding_token_is_where_the_answer_first_names_a_value() -> None:
    pieces = ["The", " account", " is", " currently", " suspended", "."]
    prefixes = ["".join(pieces[:t + 1]) for t in range(len(pieces))]
    assert value_token(prefixes, ["active", "suspended"]) == 4
    values = ["active", "suspended"]
    assert deciding_token(prefixes, values, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 6]).index == 4
    # "inactive" does not name "active": no value, so the first token where stale's answer differs
    no_value = ["".join(["It", " is", " inactive"][:t + 1]) for t in range(3)]
    at = deciding_token(no_value, ["active", "suspended"], [7, 8, 9], [7, 5, 9])
    assert at.index == 1 and "differ" in at.why
    assert deciding_token(no_value, ["active"], [7, 8, 9], [7, 8, 9]).index == 0


@pytest.mark.slow
def test_a_free_answer_run_reads_a_token_of_the_value(data_dir) -> None:
    eng = load("smollm2-135m", device="cpu", data_dir=data_dir)
    at = ACCOUNT.index("active")
    report = eng.edit(ACCOUNT, [Field(at, at + 6, "suspended", "status")], "What is the account's status?",
                      strategies=["stale", "in_place"], mechanism=True)
    m = report.mechanism
    # measured: "The account is currently suspended." (stale: "The account is currently active, …")
    assert "suspended" in report.strategies["recompute"].decision
    assert m.answer.strip() in "suspended" and len(m.answer.strip()) >= 3, m.answer  # not "The"
    assert "first names a value" in m.read_at and "teacher-forced" in m.read_at, m.read_at
    readings = [row.reading.decision.strip() for row in m.knockout if row.reading is not None]
    assert readings and "The" not in readings, readings


def _result(decision: str, kl: float, top1: bool = True, matches: bool = False):
    from worker.engine.types import StrategyResult

    return StrategyResult(decision=decision, choice_probs={}, kl_to_recompute=kl, top1_agrees=top1,
                          topk_overlap=10, logit_cosine=1.0, decision_matches_recompute=matches,
                          tokens_computed=0, latency_ms=0.0, ttft_ms=0.0, decode_ms=0.0, answer_f1=0.0,
                          recompute_answer_nll=None, prefix_cache_share=0.0)


def test_the_strategy_shown_is_picked_by_the_one_agreement_rule() -> None:
    """Issue 51 item 10: a strategy that names recompute's value in other words agrees (it is no
    "different decision" to show); the one that names the old value is shown, even at a lower KL."""
    from worker.engine import Question
    from worker.engine.mechanism import _shown

    results = {"recompute": _result("The account status is suspended.", 0.0, matches=True),
               "erratum": _result("The account is suspended now.", 0.9),  # other words, same value
               "in_place": _result("The account status is active.", 0.3, top1=True)}
    question = Question("What is the account status?")
    assert _shown(results, question, ["active", "suspended"]) == "in_place"
    # naming no value, the first answer token decides: both agree there, so the largest KL
    assert _shown(results, question, []) == "erratum"


def test_the_deciding_token_is_where_the_two_values_part() -> None:
    """Issue 51 item 7: 09:07 → 09:12 and "New York" → "New Jersey" share their first token, so
    the views read the token where the two values' tokenizations part, not the value's first."""
    pieces = ["The", " train", " leaves", " at", " 09", ":", "12", "."]
    prefixes = ["".join(pieces[:t + 1]) for t in range(len(pieces))]
    assert value_token(prefixes, ["09:07", "09:12"]) == 6  # "12", not "09"
    pieces = ["It", " ships", " to", " New", " Jersey", "."]
    prefixes = ["".join(pieces[:t + 1]) for t in range(len(pieces))]
    assert value_token(prefixes, ["New York", "New Jersey"]) == 4  # " Jersey", not " New"
    # values with nothing in common: the value's first token, as before
    pieces = ["The", " account", " is", " sus", "pended", "."]
    prefixes = ["".join(pieces[:t + 1]) for t in range(len(pieces))]
    assert value_token(prefixes, ["active", "suspended"]) == 3


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_each_strategy_is_read_at_its_own_answers_deciding_token(model) -> None:
    """Issue 51 item 7: the knockout and the lens read each strategy on ITS OWN answer (teacher-forced
    up to its own deciding token), so its unmasked decision is the token its own answer gives there
    (what the decision table shows), not what its notes say after recompute's answer."""
    eng = load(model)
    at = ACCOUNT.index("active")
    report = eng.edit(ACCOUNT, [Field(at, at + 6, "suspended", "status")], "What is the account's status?",
                      strategies=["stale", "in_place"], mechanism=True)
    m = report.mechanism
    assert set(m.answer_by) == set(m.read_at_by) == set(report.strategies)
    assert m.answer_by["recompute"] == m.answer and m.read_at_by["recompute"] == m.read_at
    for name, reading in m.unmasked.items():
        # greedy: its own answer, teacher-forced, gives its own next token again
        assert reading.decision == m.answer_by[name], (name, reading.decision, m.answer_by[name])
        assert m.logit_lens[name][-1] == pytest.approx(reading.p_answer, abs=1e-3)  # the same token
        if name != "recompute":
            assert f"of {name}'s own answer" in m.read_at_by[name]
    for name in m.read_at_by:  # the token read is one of the strategy's own answer
        token = m.answer_by[name]
        own = report.strategies[name].text or report.strategies[name].decision
        assert token.strip() == "" or token.strip() in own or name == "recompute", (name, token, own)
