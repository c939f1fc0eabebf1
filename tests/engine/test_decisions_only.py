"""A decision-only run (issue 31: a sweep's edit past its timed sample): every strategy once,
untimed, the reference computed exactly from the field on. It decides what the timed run decides,
with the same KL to the reference, and costs one surgery per strategy."""

from __future__ import annotations

import pytest

from worker.engine import Field, Question, RunRequest, load
from worker.engine.edit import Editor
from worker.engine.strategies import EDITS

DOC = ("Shipment record.\ncustomer: Halvorsen Marine\ndestination: Oslo\ncarrier: NordFreight\n"
       "Operations log: the pallets were counted, the invoice was archived, the driver called twice, "
       "the customs papers were stamped and the crane was booked for the morning shift.\n")
QUESTION = Question("What is the destination?", ("Oslo", "Madrid", "Riga"))
STRATEGIES = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective",
              "hoist", "auto")


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_a_decision_only_run_decides_what_the_timed_run_decides(alias):
    eng = load(alias)
    notes = eng.prefill(DOC)
    start = DOC.index("Oslo")
    request = RunRequest(DOC, QUESTION, fields=(Field(start, start + 4, "Madrid", "destination"),),
                         strategies=STRATEGIES, check_reference=True)
    timed = eng.run(request, notes=notes)
    untimed = eng.run(RunRequest(**{**request.__dict__, "timing": False}), notes=notes)
    assert timed.timed and not untimed.timed
    assert timed.exact_reference_kl is not None and timed.exact_reference_kl <= 1e-6
    assert untimed.exact_reference_kl is None  # checked on the timed sample only
    for name in STRATEGIES:
        a, b = timed.strategies[name], untimed.strategies[name]
        assert a.decision == b.decision, name
        assert a.decision_matches_recompute == b.decision_matches_recompute, name
        assert b.kl_to_recompute == pytest.approx(a.kl_to_recompute, abs=1e-5), name
        # the orders are read as far as the decision needs (issue 42): all 6, or 4 once settled
        every = untimed.orders_read[name] == 6
        assert untimed.orders_read[name] in (4, 6), name
        for choice in QUESTION.choices:
            if every:
                assert b.choice_probs[choice] == pytest.approx(a.choice_probs[choice], abs=1e-5), name
        assert a.tokens_computed == b.tokens_computed, name
        # nothing timed: no first token, no speed-up; the orders are still read, in the readout's
        # own forward where one mask carries the model (nothing to keep apart: measure_ms 0)
        assert (b.ttft_ms, b.latency_ms, b.speedup, b.speedup_range, b.ttft_spread_ms) == (0, 0, None, [], [])
        assert "not timed" in b.detail and a.measure_ms > 0
        for choice in QUESTION.choices:
            if every:
                assert b.choice_spread[choice] == pytest.approx(a.choice_spread[choice], abs=1e-5), name
        assert b.recompute_answer_nll == pytest.approx(a.recompute_answer_nll, abs=1e-4), name
        assert a.ttft_ms > 0 and a.speedup is not None
    assert untimed.strategies["recompute"].kl_to_recompute == 0.0
    assert "exactly from the first change on" in untimed.strategies["recompute"].detail


def test_decisions_only_run_each_surgery_once_and_never_the_full_recompute():
    eng = load("tiny-llama")
    notes = eng.prefill(DOC)
    start = DOC.index("Oslo")
    request = RunRequest(DOC, QUESTION, fields=(Field(start, start + 4, "Riga", "destination"),),
                         strategies=("recompute", "prefix_reuse", "in_place", "erratum"), timing=False)
    calls: list[str] = []
    classes = {name: EDITS.classes[name] for name in request.strategies}
    saved = {name: cls.surgery for name, cls in classes.items()}
    try:
        for name, cls in classes.items():
            def counted(self, case, name=name):
                calls.append(name)
                return saved[name](self, case)
            cls.surgery = counted
        report = eng.run(request, notes=notes)
    finally:
        for name, cls in classes.items():
            cls.surgery = saved[name]
    # the reference and prefix_reuse share the exact notes from the field on (no surgery call), and
    # in_place reads its changed tokens off them (the same tokens after the same notes): no forward
    assert sorted(calls) == ["erratum"]
    moved = report.strategies["in_place"]
    assert "read off the reference's" in moved.detail
    new_ids, segments, offsets = eng.tokenize_document(DOC.replace("Oslo", "Riga"))
    changed = Editor(eng.model, eng.rope, notes, new_ids, segments, offsets).changed()
    assert moved.tokens_computed == len(changed) > 0  # still what in_place computes
    assert report.strategies["recompute"].tokens_computed == len(eng.tokenize_document(
        DOC.replace("Oslo", "Riga"))[0])
    assert report.strategies["prefix_reuse"].tokens_computed < report.strategies["recompute"].tokens_computed


def test_a_sweep_lays_hoist_s_held_document_out_once():
    from worker.engine.strategies.edits import hoist as hoist_file

    eng = load("tiny-llama")
    notes = eng.prefill(DOC)
    start = DOC.index("Oslo")
    layouts: list[str] = []
    saved = hoist_file.hoist

    def counted(text, fields, values="new"):
        layouts.append(values)
        return saved(text, fields, values=values)

    hoist_file.hoist = counted
    try:
        for value in ("Riga", "Madrid", "Bergen"):
            eng.run(RunRequest(DOC, QUESTION, fields=(Field(start, start + 4, value, "destination"),),
                               strategies=("recompute", "hoist"), timing=False), notes=notes)
    finally:
        hoist_file.hoist = saved
    # the held layout (old values) once for the three edits; each edit's own layout with its value
    assert layouts.count("old") == 1 and layouts.count("new") == 3


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_a_free_answer_decision_only_run_decodes_together_and_reads_the_answers_likelihood(alias):
    eng = load(alias)
    notes = eng.prefill(DOC)
    start = DOC.index("Oslo")
    question = Question("What is the destination?", (), max_new_tokens=5)
    request = RunRequest(DOC, question, fields=(Field(start, start + 4, "Madrid", "destination"),),
                         strategies=("recompute", "prefix_reuse", "stale", "in_place", "erratum",
                                     "field_erratum"))
    timed = eng.run(request, notes=notes)
    seen: list[tuple[int, int]] = []
    hook = eng.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        untimed = eng.run(RunRequest(**{**request.__dict__, "timing": False}), notes=notes)
    finally:
        hook.remove()
    for name, a in timed.strategies.items():
        b = untimed.strategies[name]
        assert (a.decision, a.text) == (b.decision, b.text), name
        assert b.recompute_answer_nll == pytest.approx(a.recompute_answer_nll, abs=1e-4), name
    # the answers' steps batched: at most max_new_tokens - 1 one-token forwards of all 5 readouts
    # (prefix_reuse reads recompute's), never one per strategy and token
    steps = [shape for shape in seen if shape[1] == 1]
    assert len(steps) <= 4 and all(batch == 5 for batch, _ in steps)


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_a_free_answer_after_an_edit_of_the_same_notes_starts_from_its_draft(alias):
    """The second decision-only edit of a sweep (the same notes and question) drafts each strategy's
    answer from its answer at the edit before: the same answer as without drafts, and the run JSON's
    detail says how many tokens the draft gave."""
    from worker.engine.strategies import measure

    eng = load(alias)
    start = DOC.index("Oslo")
    question = Question("What is the destination?", (), max_new_tokens=4)
    names = ("recompute", "in_place", "erratum", "field_erratum")

    def edits(drafts: bool) -> list:
        notes = eng.prefill(DOC)
        measure.DRAFTS = drafts
        try:
            return [eng.run(RunRequest(DOC, question, fields=(Field(start, start + 4, value, "destination"),),
                                       strategies=names, timing=False), notes=notes)
                    for value in ("Riga", "Riga", "Madrid")]
        finally:
            measure.DRAFTS = True

    drafted, plain = edits(True), edits(False)
    for with_draft, without in zip(drafted, plain):
        for name in names:
            assert with_draft.strategies[name].decision == without.strategies[name].decision, name
            assert "draft" not in without.strategies[name].detail
    assert all("draft" not in r.detail for r in drafted[0].strategies.values())  # nothing before it
    # the same value again: every strategy's draft is its whole answer
    assert all("kept from a draft" in r.detail for r in drafted[1].strategies.values())
