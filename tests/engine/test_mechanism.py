"""Mechanism on the tiny families: knockout that masks nothing is the unmasked reading, selective@K
with every downstream token is prefix_reuse, the logit lens's last layer is the model's output, and
the random control draws a new set each time from a seeded generator."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import PORTABLE, QUESTION, TEXT
from worker.engine import Field, load
from worker.engine.attribution import _first_token_logits
from worker.engine.edit import Editor
from worker.engine.mechanism.knockout import draw, plan, thirds
from worker.engine.mechanism.lens import lens_logits
from worker.engine.mechanism.masked import batch_logits, prompt_logits
from worker.engine.mechanism.selective_k import k_star, k_values, recompute_sets
from worker.engine.mechanism.types import KPoint, Reading
from worker.engine.selective import has_sliding_window, recompute_selected
from worker.engine.strategies.edits.in_place import in_place as in_place_surgery
from worker.engine.strategies.edits.prefix_reuse import prefix_reuse as prefix_reuse_surgery
from worker.engine.strategies.edits.recompute import recompute as recompute_surgery
from worker.engine.strategies.edits.stale import stale as stale_surgery


def _edit(eng, new_value: str = "closed"):
    at = TEXT.index("active")
    old = eng.prefill(TEXT)
    ids, offsets, segments = eng.tokenize_document(TEXT[:at] + new_value + TEXT[at + 6:])
    editor = Editor(eng.model, eng.rope, old, ids, segments, offsets)
    prompt = eng.encode(eng.frame.suffix(QUESTION))
    return editor, prompt


@pytest.mark.parametrize("family", PORTABLE)
def test_masking_nothing_is_the_unmasked_distribution(family: str) -> None:
    eng = load(family)
    editor, prompt = _edit(eng)
    layers = recompute_surgery(editor).layers
    plain = torch.softmax(_first_token_logits(eng.model, layers, prompt)[0], dim=-1)
    n = len(layers)
    total = len(editor.new_ids) + len(prompt)
    nothing = torch.zeros(total, dtype=torch.bool)
    some = nothing.clone()
    some[total - 5:total - 1] = True  # the four tokens before the decision: inside every window
    rows = prompt_logits(eng.model, layers, prompt, [[None] * n, [nothing] * n, [some] * n])
    probs = torch.softmax(rows, dim=-1)
    assert torch.equal(probs[0], probs[1])  # an empty region masks exactly nothing
    assert float((probs[0] - plain).abs().max()) < 1e-6  # the question's own forward, read once
    assert float((probs[2] - plain).abs().max()) > 1e-6  # masking four tokens moves the decision


@pytest.mark.parametrize("family", PORTABLE)
def test_every_downstream_token_recomputed_is_prefix_reuse(family: str) -> None:
    eng = load(family)
    editor, prompt = _edit(eng, "permanently closed")
    in_place = in_place_surgery(editor).layers
    changed = [j for b in editor.blocks if not b.reuse for j in range(b.j1, b.j2)]
    everything = list(range(changed[0], len(editor.new_ids)))
    partial = sorted(changed + everything[len(changed):len(changed) + 7])
    patched, rows = recompute_sets(eng.model, in_place, editor.new_ids, [everything, partial])
    assert rows == 2 * len(everything)
    logp = torch.log_softmax(batch_logits(eng.model, patched, prompt), dim=-1)
    exact = prefix_reuse_surgery(editor).layers
    reuse = torch.log_softmax(_first_token_logits(eng.model, exact, prompt)[0], dim=-1)
    kl = float((reuse.exp() * (reuse - logp[0])).sum())
    assert kl < 1e-5 and float((reuse.exp() - logp[0].exp()).abs().max()) < 1e-5
    if not has_sliding_window(eng.model):  # the batched sets are selective's own one-pass recompute
        one = recompute_selected(eng.model, in_place, editor.new_ids, partial)
        single = torch.log_softmax(_first_token_logits(eng.model, one, prompt)[0], dim=-1)
        assert float((single.exp() - logp[1].exp()).abs().max()) < 1e-5


@pytest.mark.parametrize("family", PORTABLE)
def test_the_lens_last_layer_is_the_models_output(family: str) -> None:
    eng = load(family)
    editor, prompt = _edit(eng)
    layers = stale_surgery(editor).layers
    lens = torch.softmax(lens_logits(eng.model, layers, prompt), dim=-1)
    own = torch.softmax(_first_token_logits(eng.model, layers, prompt)[0], dim=-1)
    assert lens.shape[0] == eng.model.config.get_text_config(decoder=True).num_hidden_layers
    assert float((lens[-1] - own).abs().max()) < 1e-5
    assert float((lens[0] - own).abs().max()) > 1e-5  # an earlier layer reads otherwise


def test_the_random_control_draws_a_new_set_each_time_from_a_seeded_generator() -> None:
    pool = list(range(100, 400))
    gen = torch.Generator().manual_seed(0)
    draws = [draw(pool, 8, gen) for _ in range(5)]
    assert len({tuple(d) for d in draws}) == 5 and all(len(set(d)) == 8 for d in draws)
    again = torch.Generator().manual_seed(0)
    assert [draw(pool, 8, again) for _ in range(5)] == draws  # the same seed, the same sets
    other = torch.Generator().manual_seed(1)
    assert [draw(pool, 8, other) for _ in range(5)] != draws
    # a knockout plan: each row's controls are new sets of its size, outside the row's own region
    regions = ["sink"] * 4 + ["before_field"] * 20 + ["field"] * 3 + ["after_field"] * 60 + ["question"] * 5
    attention = torch.linspace(1.0, 0.0, len(regions))
    rows = plan(regions, attention, 30, torch.Generator().manual_seed(0))
    assert {(r, lay) for r, lay, *_ in rows} >= {("field", "all"), ("downstream_top25", "early"),
                                                 ("downstream_top25", "late"), ("sink", "all")}
    for region, _layers, _idx, positions, controls in rows:
        if not positions:
            assert controls == [] and region in ("errata", "skills")
            continue
        assert len(controls) == 5 and len({tuple(c) for c in controls}) == 5
        assert all(len(c) == len(positions) and not set(c) & set(positions) for c in controls)
    top8 = next(p for r, _l, _i, p, _c in rows if r == "downstream_top8")
    assert top8 == list(range(27, 35))  # the 8 most attended downstream positions
    assert [len(x) for x in thirds(30).values()] == [10, 10, 10] and thirds(2)["middle"] == [1]


def test_k_star_is_the_smallest_k_kept_from_there_on() -> None:
    assert k_values(11) == [0, 1, 2, 4, 8, 11] and k_values(0) == [0]
    r = Reading("yes", 0.5, 0.1)
    agree = [False, True, False, True, True, True]
    assert k_star([KPoint(k, r, a) for k, a in zip(k_values(11), agree)]) == 4
    assert k_star([KPoint(k, r, a) for k, a in zip(k_values(11), agree[:-1] + [False])]) is None


def test_a_run_carries_the_three_views() -> None:
    eng = load("tiny-llama")
    at = TEXT.index("active")
    report = eng.edit(TEXT, [Field(at, at + 6, "closed", "status")], QUESTION,
                      strategies=["stale", "in_place", "field_erratum"], mechanism=True)
    m = report.mechanism
    measured = [row for row in m.knockout if row.reading is not None]
    assert len(measured) >= 6 and all(row.control is not None for row in measured)
    assert {row.strategy for row in m.knockout} == {"recompute", m.shown}
    errata = next(r for r in m.knockout if r.strategy == "recompute" and r.region == "errata")
    assert errata.reading is None and errata.note == "no errata in these notes"
    assert m.unmasked["recompute"].kl < 1e-6  # its own reference (read in another batch)
    # in_place (K = 0) already decides as recompute on the tiny model: the sweep is skipped, and says so
    assert m.downstream > 10 and f"({m.decision!r})" in m.selective_skipped
    assert m.selective_k == [] and "already gives recompute's decision" in m.selective_skipped
    assert m.costs["selective_k"] < 0.5  # one read of the notes, not ~10 recomputes of K values
    assert set(m.logit_lens) == {"recompute", "stale", "in_place", "field_erratum"}
    assert all(len(v) == 2 for v in m.logit_lens.values())
    assert set(m.costs) == {"knockout", "selective_k", "logit_lens"} and all(c > 0 for c in m.costs.values())
    assert "mechanism" in report.to_dict()


def test_the_selective_k_sweep_draws_every_k_and_ends_at_prefix_reuse() -> None:
    """The sweep itself (run when in_place does not already agree): one point per K, K* where the
    decision is kept from there on, and every downstream token recomputed reads as prefix_reuse."""
    from worker.engine.mechanism.masked import Probe
    from worker.engine.mechanism.selective_k import sweep

    eng = load("tiny-llama")
    editor, prompt = _edit(eng, "permanently closed")
    exact = prefix_reuse_surgery(editor).layers
    reference = _first_token_logits(eng.model, exact, prompt)[0]
    probe = Probe.of(reference, int(reference.argmax()), [], eng.tokenizer.decode)
    changed = [j for b in editor.blocks if not b.reuse for j in range(b.j1, b.j2)]
    downstream = [j for b in editor.blocks if b.reuse and b.j1 >= changed[0] for j in range(b.j1, b.j2)]
    rankings = {"in_order": downstream, "missing": "not measured on this run"}
    curves, rows = sweep(eng.model, probe, in_place_surgery(editor).layers, editor.new_ids, prompt, changed,
                         downstream, rankings)
    assert [c.ranking for c in curves] == ["in_order", "missing"] and curves[1].points == []
    assert [p.k for p in curves[0].points] == k_values(len(downstream)) and rows > 0
    assert curves[0].points[-1].reading.kl < 1e-5 and curves[0].points[-1].agrees
    assert curves[0].k_star == k_star(curves[0].points)
