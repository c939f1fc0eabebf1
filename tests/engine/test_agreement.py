"""The one agreement rule (`vocabulary.agreement`, issue 43): answers agree when they decide the
same, whatever their wording; where recompute's answer names no value, the first answer token
decides and the basis says so. Pure stdlib: no model needed."""

from __future__ import annotations

from vocabulary.agreement import CHOICE, FIRST_TOKEN, VALUE, WORDS, agreement, by_verdict, named_values
from vocabulary.trajectories import StrategyTurn, TurnRecord, summaries, verdict

STATUS = ("active", "suspended")


def test_the_issues_wording_pairs_agree() -> None:
    a = agreement("The account status is suspended.", "The account is suspended.", values=STATUS)
    assert (a.agrees, a.basis) == (True, VALUE)
    assert agreement("Suspended", "The account is currently suspended.", values=STATUS).agrees
    assert agreement("The account is currently…suspended", "suspended.", values=STATUS).agrees


def test_a_different_value_disagrees_whatever_the_wording() -> None:
    assert not agreement("The account is active.", "The account is suspended.", values=STATUS).agrees
    # naming both is not naming one
    assert not agreement("It was active, now suspended.", "suspended", values=STATUS).agrees
    # "inactive" is not "active"
    assert named_values("The account is inactive.", ("active", "suspended")) == frozenset()
    # an old value read only inside a longer new one is not named
    city = named_values("New York City", ("New York", "New York City"))
    assert city == frozenset({("new", "york", "city")})


def test_choices_compare_the_choice() -> None:
    a = agreement("Yes.", "yes", choices=("yes", "no"))
    assert (a.agrees, a.basis) == (True, CHOICE)
    assert not agreement("No", "yes", choices=("yes", "no")).agrees


def test_no_value_named_falls_back_to_the_first_token_labelled() -> None:
    a = agreement("The sky is blue.", "The answer is unknown.", values=STATUS, first_token=True)
    assert (a.agrees, a.basis) == (True, FIRST_TOKEN)
    assert "names no value" in a.words
    assert agreement("Blue", "blue.", values=STATUS).basis == WORDS
    assert by_verdict("new", "new", False).agrees and not by_verdict("old", "new", True).agrees
    assert by_verdict(None, None, True).basis == FIRST_TOKEN


def _turn(i: int, answers: dict[str, tuple[str, str | None, bool]]) -> TurnRecord:
    t = TurnRecord(index=i, prompt_tokens=200, changed=[])
    for k, (decision, followed, agrees) in answers.items():
        t.results[k] = StrategyTurn(decision, agrees, followed, 0.0, 1.0, 1, 1.0, 1.0 * (i + 1), 1, 1, 0)
    return t


def test_a_stored_trajectory_judged_by_wording_is_read_again_by_value() -> None:
    """Turns stored before the rule compared the wording: hoist's 'The account status is
    suspended.' against recompute's 'The account is suspended.' was a disagreement."""
    turns = [_turn(i, {"recompute": ("The account is suspended.", "new", True),
                       "hoist": ("The account status is suspended.", "new", False)}) for i in range(4)]
    s = summaries(turns)["hoist"]
    assert (s.agreed, s.turns) == (4, 4)
    assert "agreed on 4" in verdict("hoist", s)
