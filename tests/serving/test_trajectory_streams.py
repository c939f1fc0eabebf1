"""The requests a trajectory replay sends, without a server: each variant's prompt turn by turn
(erratum's and hoist's extend the last turn's; in_place's breaks at a changed field), the question
never carried, errata where fields changed, and the spec's checks naming the turn."""

from __future__ import annotations

import pytest

from serving import TrajectoryReplaySpec, plan_turns
from vocabulary import render_erratum
from vocabulary.prefix import common_prefix
from vocabulary.prompt import question_text
from vocabulary.trajectories import FieldSpec, TurnSpec

DOC = ("SUPPORT SESSION: account record\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
       "Policy: only accounts whose status is active may log in.\n")
STATUS = DOC.index("active")
QUESTION, CHOICES = "May Dana log in now?", ("yes", "no")
ASK = question_text(QUESTION, CHOICES)


def spec(*turns: TurnSpec, **kw) -> TrajectoryReplaySpec:
    turns = turns or tuple(TurnSpec(append=f"\n[turn {i + 1}] tool result {i + 1}.",
                                    fields={3: {"status": "suspended"}, 5: {"status": "active"}}.get(i, {}))
                           for i in range(7))
    return TrajectoryReplaySpec(DOC, (FieldSpec("status", STATUS, STATUS + 6),), tuple(turns), QUESTION,
                                CHOICES, **kw)


def test_erratum_prompts_each_extend_the_last_and_keep_every_erratum():
    warm, turns = plan_turns(spec(), "erratum")
    assert warm == DOC + ASK
    for before, after in zip(turns, turns[1:]):
        assert after.prefix.startswith(before.prefix) and after.content.startswith(before.prefix)
        assert len(after.prefix) > len(before.prefix)
    for t in turns:
        assert t.content == t.prefix + ASK  # the question ends the request ...
        assert ASK not in t.prefix  # ... and is never carried
    first = render_erratum("status", "active", "suspended")
    second = render_erratum("status", "suspended", "active")
    appended = "".join(f"\n[turn {i + 1}] tool result {i + 1}." for i in range(4))
    assert turns[3].prefix == DOC + appended + first  # after the turn's own text
    assert turns[6].prefix.count(first) == 1 and turns[6].prefix.count(second) == 1
    assert [t.errata for t in turns] == [0, 0, 0, 1, 1, 2, 2]
    assert turns[6].prefix.startswith(DOC)  # the document as it was, never rewritten


def test_in_place_prompts_break_at_the_field_where_it_changed():
    _, turns = plan_turns(spec(), "in_place")
    for i, (before, after) in enumerate(zip(turns, turns[1:]), start=1):
        if i in (3, 5):  # turns 4 and 6 change the status
            assert common_prefix(before.content, after.content) == STATUS
            assert after.changed == ("status",)
        else:
            assert after.content.startswith(before.prefix) and after.changed == ()
    assert "status: suspended" in turns[3].content and "status: active" in turns[5].content
    assert turns[6].content == DOC + "".join(f"\n[turn {i + 1}] tool result {i + 1}." for i in range(7)) + ASK


def test_hoist_moves_the_fields_lines_after_the_turns_and_its_prefix_only_grows():
    warm, turns = plan_turns(spec(), "hoist")
    body = DOC.replace("status: active\n", "")
    assert warm == body + "status: active\n" + ASK
    for before, after in zip(turns, turns[1:]):
        assert after.prefix.startswith(before.prefix) and after.content.startswith(before.prefix)
    appended = "".join(f"\n[turn {i + 1}] tool result {i + 1}." for i in range(4))
    # the moved line after the turns (on a line of its own), holding the current value
    assert turns[3].content == body + appended + "\nstatus: suspended\n" + ASK
    assert turns[5].content.endswith("\nstatus: active\n" + ASK)
    assert common_prefix(warm, turns[0].content) == len(body)  # the document's body is kept from the start


def test_a_turn_question_ends_its_own_request_only():
    turns = (TurnSpec(append="\nlog one."), TurnSpec(append="\nlog two.", question="Is it paid?"),
             TurnSpec(append="\nlog three.", fields={"status": "closed"}))
    _, planned = plan_turns(spec(*turns), "erratum")
    assert planned[1].content.endswith(question_text("Is it paid?")) and planned[1].choices == ()
    assert "Is it paid?" not in planned[2].content and planned[2].choices == CHOICES
    assert planned[2].moved == (("status", "active", "closed"),)
    assert planned[0].moved == ()  # nothing differs from the document yet: no edit to follow


def test_setting_a_field_to_its_value_is_no_change():
    _, planned = plan_turns(spec(TurnSpec(append="\nx.", fields={"status": "active"})), "erratum")
    assert planned[0].changed == () and planned[0].errata == 0 and "has changed" not in planned[0].content


def test_bad_turns_are_named():
    problems = spec(TurnSpec(append="\nok."), TurnSpec(), TurnSpec(append="\nz.", fields={"tier": "gold"}),
                    TurnSpec(question=" ")).problems()
    assert "turn 2 is empty: it appends nothing, changes no field, places no skill and asks nothing" \
        in problems
    assert "turn 3 changes a field 'tier' that the document does not have (fields: status)" in problems
    assert "turn 4's question is empty" in problems
    unasked = spec(TurnSpec(append="a"), TurnSpec(append="b", question="Paid?")).replace(question="")
    assert unasked.problems() == ["turn 1 asks no question and the trajectory has none"]
    assert spec(variants=("stale",)).problems() == [
        "variants: unknown 'stale'; valid: in_place, erratum, hoist"]
    assert spec().problems() == []


@pytest.mark.parametrize("variant", ["in_place", "erratum", "hoist"])
def test_one_request_per_turn_in_order(variant):
    warm, turns = plan_turns(spec(), variant)
    assert [t.index for t in turns] == list(range(7)) and all(t.variant == variant for t in turns)
    assert all(t.content.endswith(ASK) for t in turns) and warm.endswith(ASK)


def test_a_placed_skill_is_its_text_before_the_turns_own():
    from vocabulary.trajectories import SkillSpec

    style = SkillSpec("style", "\nAnswer in one word.")
    turns = (TurnSpec(append="\nlog one."), TurnSpec(append="\nlog two.", skill="style"))
    _, planned = plan_turns(spec(*turns, skills=(style,)), "hoist")
    body = DOC.replace("status: active\n", "")
    assert planned[1].prefix == body + "\nlog one.\nAnswer in one word.\nlog two."
    assert spec(TurnSpec(skill="tone")).problems() == [
        "turn 1 places a skill 'tone' that the trajectory does not have (skills: none)"]
