"""Selective recompute (CacheBlend's rule): the ranking pass stops after layer 1's K/V and scores
exactly what a full forward would give there; recomputing every candidate equals recompute."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from worker.engine import load
from worker.engine.notes import layers_of
from worker.engine.selective import (
    GAP_MERGE,
    movement,
    recompute_in_one_pass,
    recompute_in_runs,
    recompute_selected,
    runs,
    takes_mask_per_layer_type,
    top_fraction,
)

TEXT = ("Account record. status: active. owner: Ada Lovelace. region: north. "
        "Only accounts whose status is active may log in; others are refused at the door.")


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3", "tiny-phi"])
def test_movement_is_the_layer_1_kv_deviation_of_a_full_forward(alias):
    eng = load(alias)
    old = eng.prefill(TEXT)
    start = TEXT.index("active")
    new_ids = eng.tokenize_document(TEXT[:start] + "closed" + TEXT[start + 6:])[0]
    first = next(i for i, (a, b) in enumerate(zip(old.token_ids, new_ids)) if a != b)
    stale = old.layers  # same length: "active" and "closed" are 6 bytes each
    scores = movement(eng.model, stale, new_ids, first)
    with torch.inference_mode():
        cache = DynamicCache()
        eng.model(input_ids=torch.tensor([new_ids]), cache=cache, use_cache=True)
    k, v = layers_of(cache)[1]
    k_old, v_old = stale[1]
    expected = ((k - k_old).norm(dim=-1) + (v - v_old).norm(dim=-1)).sum(dim=1)[0, first:]
    assert scores.shape == expected.shape
    assert torch.allclose(scores, expected, atol=1e-4)
    assert float(scores[0]) > 0  # the changed token itself moved


def test_recomputing_every_candidate_equals_recompute():
    eng = load("tiny-llama")
    ids = eng.tokenize_document(TEXT)[0]
    exact = eng.prefill(TEXT).layers
    noisy = [(k + 0.1 * torch.randn_like(k), v + 0.1 * torch.randn_like(v)) for k, v in exact]
    start = 10
    mixed = [(torch.cat([ke[:, :, :start], kn[:, :, start:]], 2),
              torch.cat([ve[:, :, :start], vn[:, :, start:]], 2))
             for (ke, ve), (kn, vn) in zip(exact, noisy)]
    chosen = top_fraction(torch.arange(len(ids) - start, dtype=torch.float),
                          list(range(start, len(ids))), start, 1.0)
    before = [k.clone() for k, _ in mixed]
    fixed = recompute_selected(eng.model, mixed, ids, chosen)
    err = max(float((a - b).abs().max())
              for (ka, va), (kb, vb) in zip(fixed, exact) for a, b in ((ka, kb), (va, vb)))
    assert err <= 1e-4
    assert all(torch.equal(k, b) for (k, _), b in zip(mixed, before))  # the reused notes are not written


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_one_pass_equals_recompute_in_runs(alias):
    """The one-pass forward (Gemma 3: a sliding-window mask and a full one, per layer type) leaves the
    K/V that recomputing run by run does; the text is longer than tiny-gemma3's window of 16."""
    eng = load(alias)
    ids = eng.tokenize_document(TEXT)[0]
    exact = eng.prefill(TEXT).layers
    torch.manual_seed(0)
    noisy = [(k + 0.1 * torch.randn_like(k), v + 0.1 * torch.randn_like(v)) for k, v in exact]
    chosen = list(range(3, len(ids), 5))  # gaps of 4 unselected tokens: the runs are not merged
    assert len(ids) > 2 * 16 and len(runs(chosen, GAP_MERGE)) == len(chosen)
    if alias == "tiny-gemma3":
        assert takes_mask_per_layer_type(eng.model)
    one = recompute_in_one_pass(eng.model, noisy, ids, chosen)
    by_runs = recompute_in_runs(eng.model, noisy, ids, chosen)
    err = max(float((a - b).abs().max())
              for (ka, va), (kb, vb) in zip(one, by_runs) for a, b in ((ka, kb), (va, vb)))
    assert err <= 1e-4
    moved = max(float((a - b).abs().max()) for (a, _), (b, _) in zip(one, noisy))
    assert moved > 1e-2  # the selected K/V were written
