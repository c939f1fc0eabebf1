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
