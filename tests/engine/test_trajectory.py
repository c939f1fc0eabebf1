"""Trajectories on the tiny random families: every strategy carries its own cache through turns
that append text and change fields. prefix_reuse reads recompute's decision on every turn (KL at
float32 numerics); erratum and field_erratum compute fewer cumulative tokens than recompute; the
one_per_field variant holds one erratum per field; hoist carries its layout with the field block
last (its readout is that of the hoisted prompt prefilled at once); auto is its adopted policy, and
refused without one; a placed skill is spliced (its keys those of the skill computed at its place)
by the strategies that are not exact and prefilled by the exact ones; bad turns are refused naming
the turn."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import keys_at, max_rel_error
from vocabulary import EDIT_INFO
from vocabulary.trajectories import (
    ONE_PER_FIELD,
    FieldSpec,
    accepted,
    carried,
    composite,
    default_keys,
    hoisted_prompt,
    unknown_keys,
)
from worker.engine import EngineError, Field, Question, load
from worker.engine.carry import Carried, splice_skill
from worker.engine.compare import fidelity
from worker.engine.forward import extend
from worker.engine.notes import cache_from_layers
from worker.engine.readout import decide, orders_suffixes
from worker.engine.strategies import EDITS
from worker.engine.trajectory import TrajectoryRequest, Turn, TurnSkill, _build, check, trajectory

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
    keys = [*default_keys(), *(f"{k}.{ONE_PER_FIELD}" for k in ERRATUM_KEYS)]
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
    reuse = summary[PREFIX_REUSE]  # stale ran: agreement is also read on the turns that changed the decision
    moved = [not t.results["stale"].agrees for t in report.turns]
    assert (reuse.changed_turns, reuse.changed_agreed) == (sum(moved), sum(moved))  # exact on each
    assert summary["stale"].changed_agreed == 0  # stale disagrees on every turn that counts, by definition
    words = report.verdicts()[PREFIX_REUSE]
    assert (f"{PREFIX_REUSE} agreed on {sum(moved)} (6 of 6 turns in all)" in words if any(moved)
            else words.startswith(f"no turn changed recompute's decision: {PREFIX_REUSE} agreed on 6 of 6"))


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
    """Every edit strategy whose descriptor says how it carries (all but the composite) is carried,
    and the engine builds each (hoist as its layout); auto is accepted too, built as the adopted
    policy's strategy, and needs one."""
    classes = EDITS.classes
    assert carried() == tuple(n for n, c in classes.items() if c.info.role != "composite")
    assert [n for n, c in classes.items() if c.info.carrying == "follows_policy"] == ["auto"]
    assert len(carried()) == 8 and "hoist" in carried() and default_keys() == carried()
    auto = composite()
    assert accepted() == (*carried(), auto) == EDITS.names
    built = _build(list(accepted()), policy="erratum")
    assert list(built) == list(accepted())
    assert type(built[auto][0]) is classes["erratum"]
    assert [k for k, (s, _) in built.items() if s.info.carrying == "fields_last"] == ["hoist"]
    with pytest.raises(EngineError, match="needs an adopted sweep policy"):
        _build([auto])


def test_only_strategies_that_append_errata_have_a_one_per_field_variant():
    """`.one_per_field` cuts a field's earlier erratum: on in_place or hoist it would run the plain
    strategy under another name, so it is refused, naming the two that append errata."""
    assert [n for n in carried() if EDIT_INFO[n].appends_errata] == ["erratum", "field_erratum"]
    assert unknown_keys([f"erratum.{ONE_PER_FIELD}", f"field_erratum.{ONE_PER_FIELD}"]) == ""
    problem = unknown_keys([f"in_place.{ONE_PER_FIELD}", f"hoist.{ONE_PER_FIELD}", "erratum"])
    assert problem.startswith("unknown trajectory strategies: 'in_place.one_per_field', "
                              "'hoist.one_per_field';")
    assert "(the ones that append errata, erratum, field_erratum, also as name.one_per_field)" in problem


@pytest.mark.parametrize(("turn", "message"), [
    (Turn(), "turn 2 is empty"),
    (Turn(fields=(("tier", "gold"),)), "turn 2 changes a field 'tier'"),
    (Turn(append="x " * 5000), "turn 2: the prompt would be"),
    (Turn(skill="unknown"), r"turn 2 places a skill 'unknown' that the trajectory does not have "
                            r"\(skills: refunds\)"),
    (Turn(skill="refunds", append="x " * 5000), "turn 2: the prompt would be"),
])
def test_bad_turns_are_refused_naming_the_turn(turn, message):
    eng = load("tiny-llama", device="cpu")
    request = TrajectoryRequest(DOCUMENT, FIELDS, (Turn(append="ok"), turn), QUESTION,
                                skills=(TurnSkill("refunds", REFUNDS),))
    with pytest.raises(EngineError, match=message):
        check(eng, request)


@pytest.mark.parametrize(("policy", "message"), [
    (None, "auto in a trajectory applies the notebook's adopted sweep policy, and none is adopted"),
    ("auto", "the adopted policy 'auto' names no plain strategy"),
    ("nonesuch", "the adopted policy 'nonesuch' names no plain strategy"),
])
def test_auto_without_a_plain_policy_is_refused(policy, message):
    eng = load("tiny-llama", device="cpu")
    request = TrajectoryRequest(DOCUMENT, FIELDS, (Turn(append="ok"),), QUESTION, ("erratum", "auto"),
                                policy=policy)
    with pytest.raises(EngineError, match=message):
        check(eng, request)


# ---- hoist, auto and skills ------------------------------------------------------------------------

LINES = ("Account record.\nstatus: active\nowner: Ada Lovelace\nregion: north\n"
         "Only accounts whose status is active may log in; others are refused at the door.\n")
LINE_FIELDS = (Field(LINES.index("active"), LINES.index("active") + 6, "active", "status"),)
REFUNDS = "Refund policy: refunds go only to accounts that are active.\n"


def test_hoist_keeps_its_field_block_last_and_reads_the_hoisted_prompt():
    """hoist computes each turn's text and its field block (status line, current value) and
    nothing else; its cache is the hoisted prompt's tokens, and its KL to recompute is that of the
    hoisted prompt prefilled in one forward (within float32 numerics)."""
    eng = load("tiny-llama", device="cpu")
    ts = turns(4)
    report = trajectory(eng, TrajectoryRequest(LINES, LINE_FIELDS, ts, QUESTION, ("hoist",)))
    specs = [FieldSpec("status", f.start, f.end) for f in LINE_FIELDS]
    values, appended, ids = {"status": "active"}, "", None
    for t, r in zip(ts, report.turns):
        values.update(dict(t.fields))
        appended += t.append
        kept, block = hoisted_prompt(LINES, specs, values, appended)
        body = eng.tokenize_document(hoisted_prompt(LINES, specs, values, "")[0])[0]
        ids = body + [i for u in ts[:r.index + 1] for i in eng.encode(u.append)] + eng.encode(block)
        hoist = r.results["hoist"]
        assert hoist.tokens_computed == len(eng.encode(t.append)) + len(eng.encode(block)), r.index
        assert hoist.cache_tokens == len(ids) and hoist.errata == 0
        assert block.startswith("\nstatus: ") and values["status"] in block
    question = QUESTION
    suffix = eng.encode(eng.frame.suffix(question))
    orders = orders_suffixes(eng.tokenizer, eng.frame, question)

    def logits(token_ids):
        layers = extend(eng.model, None, token_ids)
        return decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(layers, eng.model), suffix,
                      question, orders=orders).logits

    full = eng.tokenize_document(LINES.replace("active\n", "suspended\n", 1) + appended)[0]
    kl = fidelity(logits(full), logits(ids)).kl_to_recompute
    last = report.turns[-1].results
    assert last["hoist"].kl_to_recompute == pytest.approx(kl, rel=1e-3, abs=1e-6)
    assert last["hoist"].kl_to_recompute > 1e-4  # the layout differs from recompute's: a real KL


def test_auto_carries_the_adopted_policy_at_its_cost():
    eng = load("tiny-qwen3", device="cpu")
    report = trajectory(eng, TrajectoryRequest(DOCUMENT, FIELDS, turns(5), QUESTION, ("erratum", "auto"),
                                               policy="erratum"))
    for t in report.turns:
        auto, erratum = t.results["auto"], t.results["erratum"]
        assert (auto.decision, auto.tokens_computed, auto.cache_tokens, auto.errata) == \
            (erratum.decision, erratum.tokens_computed, erratum.cache_tokens, erratum.errata)
        assert auto.kl_to_recompute == pytest.approx(erratum.kl_to_recompute, rel=1e-6, abs=1e-9)
    assert report.turns[-1].results["auto"].errata == 3


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gemma3"])
def test_a_spliced_skill_holds_the_keys_it_would_have_at_its_place(family):
    """The skill compiled once after its sink (positions 0..m), spliced after a cache of n tokens:
    its keys are those of [sink, skill] computed directly at positions n-1..n+m-1 (every layer, its
    own RoPE), its values the compiled ones, bit for bit; no token is computed."""
    eng = load(family, device="cpu")
    notes = eng.prefill(LINES)
    skill = eng.compile_skill(REFUNDS)
    n, body = notes.n_tokens, skill.token_ids[1:]
    state = Carried("stale", None, False, list(notes.token_ids), list(notes.segments), list(notes.offsets),
                     notes.layers, n, {}, {})
    splice_skill(state, skill)
    assert state.ids == notes.token_ids + body and state.spliced == len(body)
    assert state.segments[n:] == ["skill"] * len(body)
    spliced = [k[:, :, n:] for k, _ in state.layers]
    direct = [k[:, :, 1:] for k in keys_at(eng, skill.token_ids, n - 1)]
    assert max_rel_error(spliced, direct) <= 1e-4
    assert max_rel_error(spliced, [k[:, :, 1:] for k, _ in skill.layers]) > 1e-2  # they did move
    assert all(torch.equal(v[:, :, n:], sv[:, :, 1:]) for (_, v), (_, sv) in zip(state.layers, skill.layers))
    assert all(torch.equal(k[:, :, :n], nk) for (k, _), (nk, _) in zip(state.layers, notes.layers))


def test_a_skill_turn_is_spliced_by_strategies_and_prefilled_by_exact_ones():
    eng = load("tiny-llama", device="cpu")
    ts = list(turns(4))
    ts[1] = Turn(append=ts[1].append, skill="refunds")
    keys = ("prefix_reuse", "stale", "in_place", "erratum", "hoist")
    report = trajectory(eng, TrajectoryRequest(LINES, LINE_FIELDS, tuple(ts), QUESTION, keys,
                                               skills=(TurnSkill("refunds", REFUNDS),)))
    m, before, at = len(eng.encode(REFUNDS)), report.turns[0].results, report.turns[1].results
    appended = len(eng.encode(ts[1].append))
    for key in ("stale", "in_place", "erratum"):
        assert at[key].tokens_spliced == m and at[key].tokens_computed == appended, key
        assert at[key].cache_tokens == before[key].cache_tokens + m + appended, key
    assert at["hoist"].tokens_spliced == m
    assert at["hoist"].cache_tokens == before["hoist"].cache_tokens + m + appended
    for key in ("recompute", "prefix_reuse"):
        assert at[key].tokens_spliced == 0 and at[key].cache_tokens == report.turns[1].prompt_tokens
    assert at["prefix_reuse"].tokens_computed >= m + appended and at["prefix_reuse"].kl_to_recompute <= 1e-6
    assert all(t.results["stale"].tokens_spliced == 0 for i, t in enumerate(report.turns) if i != 1)
    # the skill's text is in recompute's prompt from turn 2 on
    assert report.turns[1].prompt_tokens - report.turns[0].prompt_tokens >= m + appended - 2
