"""Verdicts a user can trust, on tiny random models: normalised answers and token F1, the NLL of
recompute's answer under each strategy's notes, time to first token, the exact-prefix serving-cache
share, and the notes map with character offsets, batched exactly."""

from __future__ import annotations

import pytest
import torch

from vocabulary import render_erratum
from vocabulary.prefix import common_prefix
from worker.engine import Field, Question, RunRequest, load
from worker.engine.attribution import _first_token_logits, _patched, _stack
from worker.engine.compare import normalize_answer, same_answer, token_f1
from worker.engine.forward import answer_nll
from worker.engine.notes import cache_from_layers

TEXT = ("Account record\nstatus: active\nregion: north\nplan: basic\n"
        "Only accounts whose status is active may log in. Support answers within a day.\n")
FREE = Question("What is the status of the account?", max_new_tokens=8)


@pytest.mark.parametrize(("prediction", "reference", "f1"), [
    # 1 common of 5 predicted (article dropped), 1 reference
    ("The shipment goes to Madrid.", "Madrid", 0.4),
    ("à Madrid", "madrid", 2 / 3),
    ("Madrid, Spain", "Madrid Spain", 1.0),
    ("Oslo", "Madrid", 0.0),
    ("", "", 1.0),
    ("the a an", "", 1.0),                                # nothing left after normalisation on either side
])
def test_token_f1_known_pairs(prediction, reference, f1):
    assert token_f1(prediction, reference) == pytest.approx(f1)


def test_normalisation_is_squads():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert same_answer("Madrid.", "madrid") and not same_answer("Madrid", "Oslo")


def _edit(question: Question, **kw):
    eng = load("tiny-llama")
    start = TEXT.index("active")
    request = RunRequest(TEXT, question, fields=(Field(start, start + 6, "closed", "status"),), **kw)
    return eng, eng.run(request)


def test_free_answer_verdicts_against_recompute():
    eng, report = _edit(FREE)
    rec, exact = report.strategies["recompute"], report.strategies["prefix_reuse"]
    assert rec.answer_f1 == 1 and rec.decision_matches_recompute and rec.recompute_answer_nll is not None
    # prefix_reuse's notes equal recompute's: the same answer, scored the same
    assert (exact.answer_f1 == 1
            and exact.recompute_answer_nll == pytest.approx(rec.recompute_answer_nll, abs=1e-4))
    for name, r in report.strategies.items():
        assert r.ttft_ms > 0 and r.decode_ms >= 0, name
        assert r.ttft_ms + r.decode_ms == pytest.approx(r.latency_ms, abs=0.01), name
        assert 0 <= r.answer_f1 <= 1 and r.decision_matches_recompute == same_answer(r.decision, rec.decision)
    assert report.strategies["stale"].decode_ms > 0  # a free answer is generated token by token


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_answer_nll_is_the_teacher_forced_mean_of_one_plain_forward(alias):
    """`answer_nll` after cached notes equals -mean log p of the answer in one forward over everything."""
    eng = load(alias)
    notes = eng.prefill(TEXT)
    prompt = eng.encode(eng.frame.suffix(FREE))
    answer = eng.encode(" closed, since yesterday")
    got = answer_nll(eng.model, notes.layers, prompt, answer)
    with torch.no_grad():
        logits = eng.model(torch.tensor([notes.token_ids + prompt + answer])).logits[0].float()
    n = len(notes.token_ids) + len(prompt)
    logp = torch.log_softmax(logits[n - 1 : -1], dim=-1)
    assert got == pytest.approx(-float(logp.gather(1, torch.tensor(answer)[:, None]).mean()), abs=1e-4)
    assert answer_nll(eng.model, notes.layers, prompt, []) is None
    again = answer_nll(eng.model, notes.layers, prompt, answer)
    assert again == got  # the notes were not changed by scoring


def test_prefix_cache_share_keeps_an_appended_erratum_and_loses_what_follows_a_field():
    eng, report = _edit(Question("Can this user log in?", ("yes", "no")),
                        strategies=("stale", "erratum", "in_place"))
    old = eng.tokenize_document(TEXT)[0]
    suffix = eng.encode(eng.frame.suffix(Question("Can this user log in?", ("yes", "no"))))
    s = report.strategies
    assert s["stale"].prefix_cache_share == 1.0  # the original prompt unchanged, the question included
    erratum = eng.encode(render_erratum("status", "active", "closed"))
    sent = old + erratum + suffix  # the cache holds old + suffix: the erratum's first tokens may match it
    held = common_prefix(old + suffix, sent)
    assert s["erratum"].prefix_cache_share == pytest.approx(held / len(sent), abs=1e-4) and held >= len(old)
    new = eng.tokenize_document(TEXT.replace("active", "closed", 1))[0]
    kept = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    assert s["in_place"].prefix_cache_share == pytest.approx(kept / (len(new) + len(suffix)), abs=1e-4)
    assert s["recompute"].prefix_cache_share == s["in_place"].prefix_cache_share


def test_prefix_cache_share_holds_a_placed_skill_as_part_of_the_original_prompt():
    from worker.engine import Placement

    at = TEXT.index("region")
    _, report = _edit(Question("Can this user log in?", ("yes", "no")), strategies=("stale", "in_place"),
                      placements=(Placement(text="Answer in one word. ", at=at),))
    s = report.strategies
    assert s["stale"].prefix_cache_share == 1.0  # was 0.30 when the cache held only the bare document
    assert 0 < s["in_place"].prefix_cache_share < 0.5  # the field comes before the skill


def test_choice_questions_take_their_first_token_in_the_one_forward():
    _, report = _edit(Question("Can this user log in?", ("yes", "no")), strategies=("stale",))
    for r in report.strategies.values():
        assert r.decode_ms < r.ttft_ms  # the choices are scored in the same forward as the question


def test_notes_map_spans_carry_offsets_inside_the_document():
    eng, report = _edit(Question("Can this user log in?", ("yes", "no")),
                        strategies=("stale",), attribution=True)
    notes_map = report.attribution
    assert notes_map is not None and notes_map.kl_in_place >= 0 and len(notes_map.spans) >= 2
    start = TEXT.index("active")
    for span in notes_map.spans:
        assert 0 <= span.start_char < span.end_char <= len(TEXT)
        assert span.start_char >= start  # spans begin at the first change
    assert report.to_dict()["attribution"]["field_share"] == notes_map.field_share


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_batched_first_token_logits_equal_one_cache_at_a_time(alias):
    eng = load(alias)
    a = eng.prefill(TEXT).layers
    b = eng.prefill(TEXT.replace("north", "south")).layers
    prompt = eng.encode(eng.frame.suffix(Question("Where?")))
    batched = _first_token_logits(eng.model, _stack([a, b]), prompt)
    for i, layers in enumerate((a, b)):
        with torch.no_grad():
            one = eng.model(torch.tensor([prompt]), cache=cache_from_layers(layers),
                            use_cache=True).logits[0, -1]
        assert torch.allclose(batched[i], one.float(), atol=1e-4)
    # a batch of patched copies: copy i is `a` with tokens bounds[i] of every layer from `b`
    bounds = [(0, 5), (10, 30)]
    for i, (start, end) in enumerate(bounds):
        for (pk, pv), (ak, av), (bk, bv) in zip(_patched(a, b, bounds), a, b):
            assert (torch.equal(pk[i, :, start:end], bk[0, :, start:end])
                    and torch.equal(pv[i, :, :start], av[0, :, :start]))
            assert (torch.equal(pk[i, :, end:], ak[0, :, end:])
                    and torch.equal(pv[i, :, start:end], bv[0, :, start:end]))


def test_no_notes_map_span_crosses_a_region_boundary():
    """A placed skill inside the document: every span is the document's or the skill's, never both,
    and none runs past the end of the field's new tokens."""
    from worker.engine import Placement

    skill = "Before answering, check account_status in the session context. "
    at = TEXT.index("region")
    _, report = _edit(Question("Can this user log in?", ("yes", "no")), strategies=("stale",),
                      attribution=True, placements=(Placement(text=skill, at=at),),
                      attention=("recompute",))
    tokens = report.attention["recompute"].tokens
    start, end = TEXT.index("active"), TEXT.index("active") + 6

    def region(t) -> str:  # a skill's tokens have no place in the document; the field's map to it
        return "skill" if t.start < 0 else "field" if (t.start, t.end) == (start, end) else t.segment

    spans = report.attribution.spans
    kinds = [{region(t) for t in tokens[sp.start:sp.end]} for sp in spans]
    assert all(len(k) == 1 for k in kinds), [(sp.text, k) for sp, k in zip(spans, kinds)]
    assert {"skill", "field", "document"} <= set().union(*kinds)  # every region was measured
    assert [sp.text for sp, k in zip(spans, kinds) if k == {"field"}] == ["closed"]
    assert any(sp.text.startswith("Before answering") for sp in spans)  # the skill's first span starts it
