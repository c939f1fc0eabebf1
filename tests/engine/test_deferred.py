"""Deferred tokens: `in_place`, `field_erratum` and `selective` may leave the tokens they recompute to
the readout's own forward. The decision, the choice probabilities and the completed notes must be
those of computing the tokens first and asking after, on every family that can defer; sliding-window
models never defer."""

from __future__ import annotations

import pytest
import torch

from worker.engine import Question, load
from worker.engine.edit import Editor
from worker.engine.forward import Deferred
from worker.engine.notes import cache_from_layers
from worker.engine.readout import decide
from worker.engine.selective import has_sliding_window
from worker.engine.strategies.edits.field_erratum import field_erratum
from worker.engine.strategies.edits.in_place import in_place
from worker.engine.strategies.edits.selective import selective

TEXT = ("Account record. status: active. owner: Ada Lovelace. region: north. "
        "Only accounts whose status is active may log in; others are refused at the door.")
CHOICES = Question("Can this user log in?", ("yes please", "no way"))
FREE = Question("Can this user log in?", max_new_tokens=6)
# every RoPE family without sliding windows
DEFERRING = ["tiny-llama", "tiny-qwen3", "tiny-phi", "tiny-llama3", "tiny-yarn", "tiny-moe"]


def editor_for(eng, old: str = "active", new: str = "suspended") -> Editor:
    start = TEXT.index(old)
    new_ids, segs, offs = eng.tokenize_document(TEXT[:start] + new + TEXT[start + len(old):])
    return Editor(eng.model, eng.rope, eng.prefill(TEXT), new_ids, segs, offs)


def ask(eng, surgery, question, erratum=()):
    suffix = eng.encode(eng.frame.suffix(question))
    cache = cache_from_layers(surgery.layers, eng.model)
    readout = decide(eng.model, eng.tokenizer, eng.frame, cache, suffix, question, pending=list(erratum),
                     deferred=surgery.deferred)
    return readout, surgery.completed(readout.deferred_kv)


def max_rel(a, b):
    return max(float((x - y).abs().max() / y.abs().max()) for (x, _), (y, _) in zip(a, b)) , \
        max(float((x - y).abs().max() / y.abs().max()) for (_, x), (_, y) in zip(a, b))


@pytest.mark.parametrize("alias", DEFERRING)
@pytest.mark.parametrize("strategy", ["in_place", "field_erratum", "selective"])
def test_a_deferred_strategy_decides_and_completes_its_notes_as_computing_first(alias, strategy):
    eng = load(alias)
    editor = editor_for(eng)
    erratum = eng.encode("\n[STATE UPDATE] status has changed from active to suspended.\n")
    make = {"in_place": lambda d: in_place(editor, defer=d),
            "field_erratum": lambda d: field_erratum(editor, erratum, defer=d),
            "selective": lambda d: selective(editor, 0.3, defer=d)}[strategy]
    first, deferred = make(False), make(True)
    assert first.deferred is None and deferred.deferred is not None
    assert len(deferred.deferred.positions) == deferred.tokens_computed - len(deferred.pending) > 0
    assert deferred.tokens_computed == first.tokens_computed
    for question in (CHOICES, FREE):
        slow, done_slow = ask(eng, first, question, first.pending)
        fast, done_fast = ask(eng, in_place(editor, True) if strategy == "in_place" else make(True), question,
                              first.pending)
        assert float((fast.logits - slow.logits).abs().max()) <= 1e-4 * float(slow.logits.abs().max())
        assert fast.decision == slow.decision and fast.answer_ids == slow.answer_ids
        for c in question.choices:
            assert abs(fast.choice_probs[c] - slow.choice_probs[c]) < 1e-5
        assert done_fast.deferred is None
        k_err, v_err = max_rel(done_fast.layers, done_slow.layers)
        assert k_err <= 1e-4 and v_err <= 1e-4


def test_the_deferred_positions_are_the_changed_tokens_and_the_selected_ones():
    eng = load("tiny-llama")
    editor = editor_for(eng)
    changed = [j for b in editor.blocks if not b.reuse for j in range(b.j1, b.j2)]
    assert list(in_place(editor, defer=True).deferred.positions) == changed
    sel = selective(editor, 0.3, defer=True)
    downstream = len(editor.new_ids) - changed[0] - len(changed)
    assert set(changed) <= set(sel.deferred.positions)
    assert len(sel.deferred.positions) == len(changed) + -(-3 * downstream // 10)  # ceil(30%)
    assert list(sel.deferred.ids) == [editor.new_ids[j] for j in sel.deferred.positions]


@pytest.mark.parametrize("alias", ["tiny-gemma3", "tiny-mistral"])
def test_sliding_window_models_compute_first_and_refuse_a_deferred_readout(alias):
    eng = load(alias)
    assert has_sliding_window(eng.model)
    editor = editor_for(eng)
    assert in_place(editor, defer=True).deferred is None
    assert selective(editor, 0.3, defer=True).deferred is None
    surgery = in_place(editor)
    bad = Deferred((3,), (editor.new_ids[3],))
    with pytest.raises(ValueError, match="sliding-window model cannot defer"):
        decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(surgery.layers, eng.model),
               eng.encode(eng.frame.suffix(CHOICES)), CHOICES, deferred=bad)


@pytest.mark.parametrize("positions, ids", [((3, 1), (5, 6)), ((1, 1), (5, 6)), ((1,), (5, 6))])
def test_deferred_positions_must_be_sorted_distinct_and_match_the_ids(positions, ids):
    with pytest.raises(ValueError, match="sorted"):
        Deferred(positions, ids)


def test_a_surgery_with_deferred_tokens_cannot_complete_without_their_kv():
    eng = load("tiny-llama")
    with pytest.raises(ValueError, match="needs the readout's K/V"):
        in_place(editor_for(eng), defer=True).completed(None)


def test_deferred_rows_see_only_the_notes_before_them_and_the_question_sees_none_of_the_stale_ones():
    from worker.engine.readout import _mask

    mask = _mask(6, Deferred((2, 4), (7, 8)), [-2, -2, -1, -1, 0], torch.device("cpu"))[0, 0]
    cached, new = mask[:, :6], mask[:, 6:]
    assert cached[0].tolist() == [True, True, False, False, False, False]  # row at 2: positions 0, 1
    assert cached[1].tolist() == [True, True, False, True, False, False]  # row at 4: 0, 1, 3 (2 is deferred)
    assert all(cached[r].tolist() == [True, True, False, True, False, True] for r in (2, 3, 4))
    assert new[:2].tolist() == [[True, False, False, False, False], [True, True, False, False, False]]
    assert new[2:].tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                                [True, True, True, True, True]]
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool()
    assert torch.equal(_mask(3, None, [-1, 0], torch.device("cpu"))[0, 0], expected)


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-qwen3"])
def test_composed_strategies_that_defer_score_as_those_that_compute_first(alias, monkeypatch):
    import worker.engine.strategies.compose as compose_strategies

    eng = load(alias)
    skills = ["Rule one: the door opens only for active accounts.",
              "Rule two: suspended accounts are refused."]
    names = ["seam", "epic", "selective"]
    for question in (CHOICES, FREE):
        deferred = eng.compose(TEXT, skills, question, strategies=names)
        # forces a forward of their own
        monkeypatch.setattr(compose_strategies, "has_sliding_window", lambda model: True)
        first = eng.compose(TEXT, skills, question, strategies=names)
        monkeypatch.undo()
        for name in names:
            a, b = deferred.strategies[name], first.strategies[name]
            assert a.tokens_computed == b.tokens_computed > 0
            assert a.decision == b.decision and a.top1_agrees == b.top1_agrees
            assert abs(a.kl_to_recompute - b.kl_to_recompute) <= 1e-5 + 1e-3 * b.kl_to_recompute
            assert a.recompute_answer_nll == pytest.approx(b.recompute_answer_nll, abs=1e-4)
            for c in question.choices:
                assert abs(a.choice_probs[c] - b.choice_probs[c]) < 1e-5


def test_completing_a_deferred_surgery_never_writes_into_the_old_notes():
    eng = load("tiny-llama")
    # a field; the whole text
    for old, new in (("active", "suspended"), (TEXT, "A completely different record.")):
        editor = editor_for(eng, old, new)
        before = [(k.clone(), v.clone()) for k, v in editor.old.layers]
        for surgery in (in_place(editor, defer=True), selective(editor, 0.5, defer=True)):
            ask(eng, surgery, CHOICES)
        assert all(torch.equal(k, k0) and torch.equal(v, v0)
                   for (k, v), (k0, v0) in zip(editor.old.layers, before))

