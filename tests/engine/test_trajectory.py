"""Trajectories on the tiny random families: every strategy carries its own cache through turns
that append text and change fields. prefix_reuse reads recompute's decision on every turn (KL at
float32 numerics); erratum and field_erratum compute fewer cumulative tokens than recompute; the
one_per_field variant holds one erratum per field; bad turns are refused naming the turn."""

from __future__ import annotations

import pytest

from vocabulary import EDIT_INFO
from vocabulary.trajectories import ONE_PER_FIELD, carried
from worker.engine import EngineError, Field, Question, load
from worker.engine.strategies import EDITS, Strategy
from worker.engine.trajectory import TrajectoryRequest, Turn, check, trajectory

DOCUMENT = ("Account record. status: active. owner: Ada Lovelace. region: north. "
            "Only accounts whose status is active may log in; others are refused at the door.\n")
QUESTION = Question("Can this user log in?", ("yes", "no"))
STATUS = DOCUMENT.index("active")
REGION = DOCUMENT.index("north")
FIELDS = (Field(STATUS, STATUS + 6, "active", "status"), Field(REGION, REGION + 5, "north", "region"))
PREFIX_REUSE = [n for n, i in EDIT_INFO.items() if i.exact and i.role != "reference"][0]
ERRATUM_KEYS = ["erratum", "field_erratum"]


def turns(n: int) -> tuple[Turn, ...]:
    out = []
    for i in range(n):
        changes = ()
        if i == 2:
            changes = (("status", "suspended"),)
        elif i == 4:
            changes = (("status", "active"), ("region", "south"))
        out.append(Turn(append=f"\nTool result {i}: the ticket queue holds {3 + i} open items.",
                        fields=changes))
    return tuple(out)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3"])
def test_every_strategy_carries_its_cache_and_prefix_reuse_is_exact(family):
    eng = load(family, device="cpu")
    keys = [*carried(), *(f"{k}.{ONE_PER_FIELD}" for k in ERRATUM_KEYS)]
    report = trajectory(eng, TrajectoryRequest(DOCUMENT, FIELDS, turns(6), QUESTION, tuple(keys)))
    assert len(report.turns) == 6
    assert [t.changed for t in report.turns][2:5] == [["status"], [], ["status", "region"]]
    for t in report.turns:
        reuse = t.results[PREFIX_REUSE]
        assert reuse.agrees and reuse.kl_to_recompute <= 1e-6, (t.index, reuse)
        assert list(t.results) == keys  # recompute first (it is carried first)
        ref = t.results["recompute"]
        assert ref.tokens_computed == t.prompt_tokens == ref.cache_tokens
    summary = report.summary()
    last = report.turns[-1].results
    for key in ERRATUM_KEYS:
        assert last[key].cumulative_tokens < last["recompute"].cumulative_tokens / 2, key
        assert last[key].errata == 3  # status twice, region once
        assert last[f"{key}.{ONE_PER_FIELD}"].errata == 2  # one per field
        assert last[f"{key}.{ONE_PER_FIELD}"].cache_tokens < last[key].cache_tokens
    assert summary[PREFIX_REUSE].agreement == 1.0 and summary[PREFIX_REUSE].max_kl <= 1e-6
    assert summary["recompute"].cumulative_speedup == pytest.approx(1.0)
    lo, hi = summary[PREFIX_REUSE].agreement_ci95
    assert 0.5 < lo < 1.0 and hi == 1.0
    assert report.verdicts()[PREFIX_REUSE].startswith(f"over 6 turns {PREFIX_REUSE} agreed on 6")


def test_in_place_edits_the_document_piece_of_its_cache():
    """After in_place carries a change, its cache's tokens are recompute's document tokens with the
    new value (then the appended turns, tokenized turn by turn); stale's still hold the old value."""
    eng = load("tiny-llama", device="cpu")
    floor = [n for n, i in EDIT_INFO.items() if i.role == "floor"][0]
    moving = [n for n, i in EDIT_INFO.items() if i.moves_keys and i.default and i.can_defer][0]
    report = trajectory(eng, TrajectoryRequest(DOCUMENT, FIELDS, turns(3), QUESTION, (floor, moving)))
    last = report.turns[-1].results
    appended = sum(len(eng.encode(t.append)) for t in turns(3))
    assert last[floor].cumulative_tokens == appended and last[floor].errata == 0
    new_doc = eng.tokenize_document(DOCUMENT.replace("active.", "suspended.", 1))[0]
    changed = len(new_doc) - len(eng.tokenize_document(DOCUMENT)[0])
    assert last[moving].cache_tokens == last[floor].cache_tokens + changed
    assert appended < last[moving].cumulative_tokens <= appended + 8


def test_the_carried_rule_matches_the_classes():
    classes = EDITS.classes
    expected = tuple(n for n, c in classes.items()
                     if c.info.role != "composite" and c.prepare is Strategy.prepare)
    assert carried() == expected and len(expected) == 7


@pytest.mark.parametrize(("turn", "message"), [
    (Turn(), "turn 2 is empty"),
    (Turn(fields=(("tier", "gold"),)), "turn 2 changes a field 'tier'"),
    (Turn(append="x " * 5000), "turn 2: the prompt would be"),
])
def test_bad_turns_are_refused_naming_the_turn(turn, message):
    eng = load("tiny-llama", device="cpu")
    request = TrajectoryRequest(DOCUMENT, FIELDS, (Turn(append="ok"), turn), QUESTION)
    with pytest.raises(EngineError, match=message):
        check(eng, request)
