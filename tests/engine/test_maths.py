"""The engine's maths on every tiny architecture family: re-positioning, splicing, exact prefix
reuse, in-place edits that change the length, and the refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.engine.conftest import PORTABLE, QUESTION, TEXT, keys_at, max_rel_error
from vocabulary import AUTO_CANDIDATES, METRIC_NAMES, STRATEGIES
from worker.engine import EngineError, Field, NotPortableError, Question, load
from worker.engine.compose import splice
from worker.engine.edit import Editor, diff_blocks
from worker.engine.rope import LayerRope, RopeLayout, shift_keys
from worker.engine.strategies.edits.in_place import in_place


@pytest.mark.parametrize("alias", PORTABLE)
@pytest.mark.parametrize("delta", [1, 37, 1000])
def test_shifted_keys_equal_keys_computed_at_shifted_positions(alias, delta):
    eng = load(alias)
    notes = eng.prefill(TEXT)
    moved = notes.shifted(delta)
    direct = keys_at(eng, notes.token_ids, delta)
    assert moved.first_position == delta
    assert max_rel_error([k for k, _ in moved.layers], direct) <= 1e-4
    # values carry no position: untouched
    assert all(torch.equal(a[1], b[1]) for a, b in zip(moved.layers, notes.layers))


@pytest.mark.parametrize("alias", PORTABLE)
def test_notes_keep_every_token_in_every_layer(alias):
    eng = load(alias)
    notes = eng.prefill(TEXT)
    assert notes.n_tokens > 16  # past the tiny sliding window
    assert all(k.shape[2] == notes.n_tokens == v.shape[2] for k, v in notes.layers)
    assert notes.cache.get_seq_length() == notes.n_tokens
    assert notes.token_ids[0] == eng.tokenizer.bos_token_id and notes.segments[0] == "frame"
    start, end = notes.offsets[1]
    assert TEXT[start:end] == eng.tokenizer.decode([notes.token_ids[1]])


@pytest.mark.parametrize("alias", PORTABLE)
def test_chunk_spliced_after_empty_context_equals_its_recompute(alias):
    eng = load(alias)
    context = eng.prefill("")  # just the start token
    skill = eng.compile_skill(TEXT)
    spliced = splice(eng.model, context, skill, context.n_tokens)
    direct = eng.prefill(TEXT)
    assert spliced.token_ids == direct.token_ids
    assert max_rel_error([k for k, _ in spliced.layers], [k for k, _ in direct.layers]) <= 1e-4
    assert max_rel_error([v for _, v in spliced.layers], [v for _, v in direct.layers]) <= 1e-4


@pytest.mark.parametrize("alias", PORTABLE)
def test_splice_in_the_middle_moves_the_tail_by_the_skill_length(alias):
    eng = load(alias)
    context = eng.prefill(TEXT)
    skill = eng.compile_skill(" Remember: answer briefly.")
    t = 10
    spliced = splice(eng.model, context, skill, t)
    m = skill.n_tokens - 1
    assert spliced.n_tokens == context.n_tokens + m
    assert spliced.segments[t:t + m] == ["skill"] * m
    # the tail's keys now sit exactly where the context's own tokens would be computed m later
    tail = [k[:, :, t + m:] for k, _ in spliced.layers]
    expected = [shift_keys(k[:, :, t:], eng.rope.layers[i], m) for i, (k, _) in enumerate(context.layers)]
    assert max_rel_error(tail, expected) <= 1e-6


@pytest.mark.parametrize("alias", PORTABLE + ["tiny-gpt2"])
def test_prefix_reuse_equals_recompute_and_computes_only_from_the_field(alias):
    eng = load(alias)
    start = TEXT.index("active")
    report = eng.edit(TEXT, [Field(start, start + 6, "suspended", "status")], QUESTION,
                      strategies=["recompute", "prefix_reuse", "stale"])
    reuse, full = report.strategies["prefix_reuse"], report.strategies["recompute"]
    assert reuse.kl_to_recompute < 1e-6
    assert reuse.decision == full.decision and reuse.top1_agrees and reuse.topk_overlap == 10
    new_ids, _, _ = eng.tokenize_document(TEXT[:start] + "suspended" + TEXT[start + 6:])
    first_change = next(i for i, (a, b) in enumerate(zip(eng.prefill(TEXT).token_ids, new_ids)) if a != b)
    assert reuse.tokens_computed == len(new_ids) - first_change
    assert full.tokens_computed == len(new_ids)
    assert report.strategies["stale"].tokens_computed == 0
    if alias != "tiny-mistral":  # every mistral layer sees only 16 tokens back: the field is out of reach
        assert report.strategies["stale"].kl_to_recompute > 1e-4  # the old notes are not the new ones


@pytest.mark.parametrize("alias", PORTABLE)
def test_in_place_with_a_length_change_keeps_downstream_keys_at_their_positions(alias):
    eng = load(alias)
    old = eng.prefill(TEXT)
    start = TEXT.index("active")
    new_text = TEXT[:start] + "permanently suspended" + TEXT[start + 6:]
    new_ids, segs, offs = eng.tokenize_document(new_text)
    editor = Editor(eng.model, eng.rope, old, new_ids, segs, offs)
    surgery = in_place(editor)
    assert surgery.token_ids == new_ids and len(new_ids) != old.n_tokens
    changed = sum(b.j2 - b.j1 for b in diff_blocks(old.token_ids, new_ids) if not b.reuse)
    assert surgery.tokens_computed == changed < len(new_ids) // 2
    # layer 0 keys depend only on the token and its position: every reused token must match a
    # direct computation of the new text at its NEW position
    direct = keys_at(eng, new_ids, 0)[0]
    assert float((surgery.layers[0][0] - direct).abs().max() / direct.abs().max()) <= 1e-4


def test_gemma3_needs_per_layer_rope_bases():
    eng = load("tiny-gemma3")
    assert eng.rope.bases_differ()
    bases = {lr.layer_type: lr.inv_freq[1] for lr in eng.rope.layers}
    assert set(bases) == {"sliding_attention", "full_attention"}
    notes = eng.prefill(TEXT)
    delta = 300
    direct = keys_at(eng, notes.token_ids, delta)
    right = [k for k, _ in notes.shifted(delta).layers]
    global_rope = next(lr for lr in eng.rope.layers if lr.layer_type == "full_attention")
    one_base = RopeLayout(tuple(dataclasses.replace(global_rope, layer_type=lr.layer_type)
                                for lr in eng.rope.layers))
    wrong = [k for k, _ in dataclasses.replace(notes, rope=one_base).shifted(delta).layers]
    err_right, err_wrong = max_rel_error(right, direct), max_rel_error(wrong, direct)
    assert err_right <= 1e-4
    assert err_wrong > 0.1  # one base for every layer moves the sliding layers to the wrong place


def test_partial_rotary_leaves_the_pass_through_dimensions_alone():
    eng = load("tiny-phi")
    lr = eng.rope.layers[0]
    head_dim = eng.model.config.hidden_size // eng.model.config.num_attention_heads
    assert lr.rotary_dim < head_dim
    k = torch.randn(1, 2, 5, head_dim)
    moved = shift_keys(k, lr, 17)
    assert torch.equal(moved[..., lr.rotary_dim:], k[..., lr.rotary_dim:])
    assert not torch.allclose(moved[..., :lr.rotary_dim], k[..., :lr.rotary_dim])


def test_shift_by_zero_and_back_is_identity():
    lr = LayerRope(inv_freq=1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), rotary_dim=16)
    k = torch.randn(1, 2, 7, 16)
    assert torch.equal(shift_keys(k, lr, 0), k)
    assert torch.allclose(shift_keys(shift_keys(k, lr, 123), lr, -123), k, atol=1e-5)


def test_gpt2_composition_is_refused_with_the_reason():
    eng = load("tiny-gpt2")
    with pytest.raises(NotPortableError, match="no rotary position embedding"):
        eng.compose(TEXT, ["a skill"], QUESTION)
    with pytest.raises(NotPortableError, match="learned absolute positions"):
        eng.prefill(TEXT).shifted(3)


def test_dynamic_ntk_is_refused_with_the_reason():
    eng = load("tiny-dynamic")
    with pytest.raises(NotPortableError, match="dynamic"):
        eng.compose(TEXT, ["a skill"], QUESTION)


def test_every_strategy_reports_every_metric_and_auto_says_what_it_picked():
    eng = load("tiny-llama")
    start = TEXT.index("active")
    report = eng.edit(TEXT, [Field(start, start + 6, "suspended", "status")], QUESTION, attention=True)
    data = report.to_dict()
    assert tuple(data["strategies"]) == STRATEGIES
    for name, r in data["strategies"].items():
        assert tuple(r) == METRIC_NAMES, name
        assert abs(sum(r["choice_probs"].values()) - 1) < 1e-5
        assert r["latency_ms"] > 0
    assert data["strategies"]["recompute"]["kl_to_recompute"] == 0
    auto = report.strategies["auto"]
    assert auto.picked in AUTO_CANDIDATES + ("field_erratum",)
    assert auto.detail.startswith(f"picked {auto.picked} after probing ")
    assert all(r.picked is None for name, r in report.strategies.items() if name != "auto")
    picked = report.strategies[auto.picked]
    assert auto.decision == picked.decision
    probes = auto.detail.split("after probing ")[1].split(":")[0].split(", ")
    assert probes[-1] == "field_erratum" and auto.picked in probes
    # its tokens computed are every probe's, summed (issue 33: not its pick's alone)
    assert auto.tokens_computed == sum(report.strategies[p].tokens_computed for p in probes)
    assert auto.tokens_computed >= report.strategies["field_erratum"].tokens_computed > 0
    assert auto.latency_ms >= picked.latency_ms  # every probe it ran is its cost
    assert report.attention["auto"].tokens == report.attention[auto.picked].tokens
    erratum = report.strategies["erratum"]
    assert erratum.tokens_computed == len(eng.encode(
        "\n[STATE UPDATE] status has changed from active to suspended; "
        "this overrides any earlier value and any earlier conclusion.\n"))
    sel = report.strategies["selective"]
    assert (report.strategies["in_place"].tokens_computed < sel.tokens_computed
            < data["strategies"]["recompute"]["tokens_computed"])
    att = report.attention["erratum"]
    n_layers, n_heads = eng.model.config.num_hidden_layers, eng.model.config.num_attention_heads
    assert att.weights.shape == (n_layers, n_heads, len(att.tokens))
    assert abs(float(att.weights[0, 0].astype("float32").sum()) - 1) < 1e-2  # a softmax row
    assert [t.segment for t in att.tokens].count("erratum") == erratum.tokens_computed


def test_several_fields_and_a_placed_skill_run_together():
    eng = load("tiny-llama")
    a, b = TEXT.index("active"), TEXT.index("north")
    fields = [Field(a, a + 6, "closed", "status"), Field(b, b + 5, "south", "region")]
    skill_at = TEXT.index("Only")
    from worker.engine import Placement, RunRequest

    request = RunRequest(TEXT, QUESTION, fields=tuple(fields),
                         strategies=("recompute", "stale", "in_place", "field_erratum"),
                         placements=(Placement(text="Answer in one word. ", at=skill_at),),
                         attention=("recompute", "in_place"))
    report = eng.run(request)
    rec = report.attention["recompute"].tokens
    inp = report.attention["in_place"].tokens
    assert [t.id for t in rec] == [t.id for t in inp]  # in_place ends on exactly the new tokens
    assert any(t.segment == "document" and t.start == a for t in rec)  # new value drawn on its field
    assert report.strategies["in_place"].tokens_computed < report.strategies["recompute"].tokens_computed


def test_bad_input_names_the_problem():
    eng = load("tiny-llama")
    with pytest.raises(EngineError, match="not inside the document"):
        eng.edit(TEXT, [Field(5, 10_000, "x")], QUESTION)
    with pytest.raises(EngineError, match="overlap"):
        eng.edit(TEXT, [Field(5, 15, "x"), Field(10, 20, "y")], QUESTION)
    with pytest.raises(EngineError, match="unknown strategy 'magic'"):
        eng.edit(TEXT, [Field(5, 15, "x")], QUESTION, strategies=["magic"])
    with pytest.raises(EngineError, match="outside the document"):
        eng.compose(TEXT, ["skill"], QUESTION, at=10_000)


def test_attribution_patching_every_downstream_note_closes_the_whole_gap():
    from worker.engine.attribution import attribute

    eng = load("tiny-llama")
    start = TEXT.index("active")
    fields = [Field(start, start + 6, "permanently closed", "status")]
    whole = attribute(eng, TEXT, fields, QUESTION, span_tokens=10_000)
    # regions never share a span: the field's new value is one, every note after it the other
    assert whole.kl_in_place > 1e-6 and [s.text for s in whole.spans][:1] == ["permanently closed"]
    assert len(whole.spans) == 2 and whole.spans[1].start == whole.spans[0].end
    assert whole.spans[1].kl_after < 1e-3 * whole.kl_stale and abs(whole.spans[1].share - 1) < 1e-2
    parts = attribute(eng, TEXT, fields, QUESTION, span_tokens=8, coarse=1)  # every 8-token span
    assert len(parts.spans) > 3 and all(s.end - s.start <= 8 + 8 for s in parts.spans)  # 8, cut on words
    assert (parts.kl_stale == pytest.approx(whole.kl_stale)
            and parts.field_share == pytest.approx(whole.field_share))
    # coarse to fine: 32-token spans, refined to 8 where a patch moves at least 5% of the gap
    mixed = attribute(eng, TEXT, fields, QUESTION, span_tokens=8, coarse=4)
    assert [(s.start, s.end) for s in mixed.spans][0][0] == parts.spans[0].start
    assert all(a.end == b.start for a, b in zip(mixed.spans, mixed.spans[1:]))  # they tile the notes
    for s in mixed.spans:
        assert s.end - s.start <= 8 + 8 or abs(s.share) < 0.05  # coarse only where little happens
    fine = {(s.start, s.end): s.share for s in parts.spans}
    assert all(s.share == pytest.approx(fine[(s.start, s.end)], abs=1e-5)
               for s in mixed.spans if (s.start, s.end) in fine)


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-phi", "tiny-gpt2"])
def test_choices_scored_in_one_forward_equal_one_plain_forward_each(alias):
    from worker.engine.readout import _continuation_logp

    eng = load(alias)
    notes = eng.prefill(TEXT)
    sequences = [[70, 71, 72, 73], [80, 81], [90, 91, 92]]
    batched = _continuation_logp(eng.model, notes.layers, sequences)
    for seq, got in zip(sequences, batched):
        with torch.inference_mode():
            out = eng.model(input_ids=torch.tensor([seq[:-1]]), cache=notes.cache, use_cache=True)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        expected = float(sum(logp[j, seq[j + 1]] for j in range(len(seq) - 1)))
        assert abs(got - expected) < 1e-4


def test_seam_repair_counts_the_tokens_it_recomputes():
    eng = load("tiny-llama")
    plain = eng.compose(TEXT, ["Answer in one word."], QUESTION, at=20, seam=0)
    repaired = eng.compose(TEXT, ["Answer in one word."], QUESTION, at=20, seam=4)
    assert plain.strategies["splice"].tokens_computed == 0
    assert repaired.strategies["splice"].tokens_computed == 4


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3", "tiny-gpt2"])
def test_one_pass_readout_equals_appending_then_asking_step_by_step(alias):
    """The fast path folds an erratum, the question and every choice into one forward (a block
    mask); it must decide exactly as feeding them one forward at a time does."""
    from worker.engine.forward import extend
    from worker.engine.readout import decide

    eng = load(alias)
    notes = eng.prefill(TEXT)
    erratum = eng.encode("\n[STATE UPDATE] status is now closed.\n")
    suffix = eng.encode(eng.frame.suffix(Question("Can this user log in?", ("yes please", "no way"))))
    q = Question("Can this user log in?", ("yes please", "no way"))
    fast = decide(eng.model, eng.tokenizer, eng.frame, notes.cache, suffix, q, pending=erratum)
    layers = extend(eng.model, notes.layers, erratum)
    after_question = extend(eng.model, layers, suffix)
    with torch.inference_mode():
        cache = dataclasses.replace(notes, layers=layers).cache
        slow_logits = eng.model(input_ids=torch.tensor([suffix]), cache=cache,
                                use_cache=True).logits[0, -1].float()
    assert torch.allclose(fast.logits, slow_logits, atol=1e-4)
    scores = []
    for choice in q.choices:
        ids = eng.tokenizer(eng.frame.choice_text(choice), add_special_tokens=False)["input_ids"]
        total = float(torch.log_softmax(slow_logits, -1)[ids[0]])
        with torch.inference_mode():
            cache = dataclasses.replace(notes, layers=after_question).cache
            logp = torch.log_softmax(
                eng.model(input_ids=torch.tensor([ids[:-1]]), cache=cache).logits[0].float(), -1)
        scores.append(total + float(sum(logp[j, ids[j + 1]] for j in range(len(ids) - 1))))
    expected = torch.softmax(torch.tensor(scores), 0)
    for (choice, p), e in zip(fast.choice_probs.items(), expected):
        assert abs(p - float(e)) < 1e-4, choice


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-qwen3", "tiny-phi"])
def test_selective_in_one_pass_equals_recomputing_the_same_tokens_run_by_run(alias, monkeypatch):
    import worker.engine.selective as selective

    eng = load(alias)
    start = TEXT.index("active")
    new_text = TEXT[:start] + "closed" + TEXT[start + 6:]
    new_ids, segs, offs = eng.tokenize_document(new_text)
    editor = Editor(eng.model, eng.rope, eng.prefill(TEXT), new_ids, segs, offs)
    base = in_place(editor)
    chosen = list(range(start + 12, len(new_ids), 3))  # scattered downstream tokens
    monkeypatch.setattr(selective, "GAP_MERGE", 1)  # no merging: exactly the same tokens both ways
    one = selective.recompute_in_one_pass(eng.model, base.layers, new_ids, chosen)
    runs = selective.recompute_in_runs(eng.model, base.layers, new_ids, chosen)
    assert max_rel_error([k for k, _ in one], [k for k, _ in runs]) <= 1e-4
    assert max_rel_error([v for _, v in one], [v for _, v in runs]) <= 1e-4


def test_selective_with_every_downstream_token_is_recompute():
    eng = load("tiny-llama")
    start = TEXT.index("active")
    report = eng.edit(TEXT, [Field(start, start + 6, "closed", "status")], QUESTION,
                      strategies=["recompute", "in_place", "selective"], selective_fraction=1.0)
    kl_sel, kl_in_place = (report.strategies["selective"].kl_to_recompute,
                           report.strategies["in_place"].kl_to_recompute)
    assert kl_sel < 1e-4 and kl_sel < kl_in_place / 100  # float noise of a masked path, not stale notes
