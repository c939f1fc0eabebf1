"""Split attention (cached keys unmasked + the new block causally, merged by log-sum-exp) against
transformers' SDPA on every tiny family: logits and the K/V a forward leaves, after cached notes,
for a long new block, a short one, one token, and a custom block mask."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from tests.engine.conftest import TEXT, attention_case, first_attention, forward, max_diff
from worker.engine import load
from worker.engine.notes import cache_from_layers, layers_of
from worker.engine.split_attention import SPLIT, NotesLayer
from worker.engine.tiny import TINY_MODELS

ALL_TINY = list(TINY_MODELS)
TOL = 1e-5


def _sdpa_and_split(model, layers, ids, mask=None, positions=None):
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        reference = forward(model, layers, ids, mask, positions, split_cache=False)
    finally:
        model.set_attn_implementation(previous)
    assert model.config._attn_implementation == SPLIT
    return (reference, forward(model, layers, ids, mask, positions),
            forward(model, layers, ids, mask, positions, split_cache=False))


@pytest.mark.parametrize("alias", ALL_TINY)
@pytest.mark.parametrize("cached, new", [(12, 140), (140, 12), (100, 1)])
def test_split_attention_equals_sdpa_after_cached_notes(alias, cached, new):
    """A long new block after a short prefix (prefix_reuse), a short block after long notes (an
    erratum and the question), one token (decoding); windowed families cross their 16-token window."""
    eng = load(alias)
    ids = eng.tokenize_document(TEXT + " " + TEXT)[0][: cached + new]
    notes = eng.prefill("")  # the layout of notes; replaced by the first `cached` tokens below
    with torch.inference_mode():
        cache = DynamicCache()
        eng.model(input_ids=torch.tensor([ids[:cached]]), cache=cache, use_cache=True)
    layers = layers_of(cache)
    assert notes.n_tokens >= 1 and layers[0][0].shape[2] == cached
    reference, split, split_concatenating = _sdpa_and_split(eng.model, layers, ids[cached:])
    assert max_diff(split, reference) <= TOL
    assert max_diff(split_concatenating, reference) <= TOL


@pytest.mark.parametrize("alias", ALL_TINY)
def test_split_attention_equals_sdpa_under_a_custom_block_mask(alias):
    """The readout's shape: a shared prompt, then two branches side by side (restarted positions),
    each seeing the notes, the prompt and only itself."""
    eng = load(alias)
    layers = eng.prefill(TEXT).layers
    past = layers[0][0].shape[2]
    prompt, a, b = [70, 71, 72, 73], [80, 81, 82], [90, 91]
    inputs = prompt + a + b
    owner = torch.tensor([-1] * 4 + [0] * 3 + [1] * 2)
    n = len(inputs)
    sees = (owner[:, None] == owner[None, :]) | (owner[None, :] == -1)
    mask = torch.cat([torch.ones(n, past, dtype=torch.bool),
                      torch.ones(n, n, dtype=torch.bool).tril() & sees], 1)
    positions = ([past + j for j in range(4)] + [past + 4 + j for j in range(3)]
                 + [past + 4 + j for j in range(2)])
    reference, split, split_concatenating = _sdpa_and_split(eng.model, layers, inputs,
                                                            mask[None, None], positions)
    assert max_diff(split, reference) <= TOL
    assert max_diff(split_concatenating, reference) <= TOL


def test_a_notes_cache_never_copies_or_writes_the_notes():
    eng = load("tiny-llama")
    notes = eng.prefill(TEXT)
    before = [(k.clone(), v.clone()) for k, v in notes.layers]
    cache = cache_from_layers(notes.layers, eng.model)
    with torch.inference_mode():
        eng.model(input_ids=torch.tensor([[70, 71, 72]]), cache=cache, use_cache=True)
        eng.model(input_ids=torch.tensor([[73]]), cache=cache, use_cache=True)
    for layer, (k, v), (k0, v0) in zip(cache.layers, notes.layers, before):
        assert isinstance(layer, NotesLayer)
        assert layer.notes_keys is k and layer.notes_values is v  # the very tensors, not a copy
        assert layer.tail_keys.shape[2] == 4 and layer.get_seq_length() == notes.n_tokens + 4
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert cache.get_seq_length() == notes.n_tokens + 4


@pytest.mark.parametrize("alias", ALL_TINY)
@pytest.mark.parametrize("cached, new", [(40, 300), (300, 7), (64, 1)])
def test_split_attention_function_equals_sdpa_within_1e_5(alias, cached, new):
    """The attention function itself, on keys and queries at the model's own scale: the output
    equals SDPA's under the explicit mask transformers would build (lower-right causal)."""
    from worker.engine.split_attention import split_attention_forward

    eng = load(alias)
    module, q, k, v, sees, expected = attention_case(eng.model, cached, new, seed=7)
    got, _ = split_attention_forward(module, q, k, v, None, scaling=module.scaling)
    assert float((got - expected).abs().max()) <= 1e-5
    got_masked, _ = split_attention_forward(module, q, k, v, sees, scaling=module.scaling)
    assert float((got_masked - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-phi", "tiny-gemma3"])
def test_split_attention_equals_sdpa_under_a_selective_recompute_mask(alias):
    """CacheBlend-style: 300 scattered tokens recomputed, each seeing the cached keys before its own
    position except the other selected ones, and the selected ones before it (fresh); the first
    sees no cached key at all. The cached part is cut into row groups; the answer must not move."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from worker.engine.split_attention import split_attention_forward

    eng = load(alias)
    module = first_attention(eng.model)
    cfg = eng.model.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    total = 1200
    picked = torch.randperm(total - 1, generator=torch.Generator().manual_seed(3))[:299] + 1
    sel = torch.cat([torch.tensor([0]), picked]).sort().values
    is_sel = torch.zeros(total, dtype=torch.bool)
    is_sel[sel] = True
    sees = torch.cat([(torch.arange(total)[None, :] < sel[:, None]) & ~is_sel[None, :],
                      sel[None, :] <= sel[:, None]], 1)
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, heads, len(sel), d, generator=gen) * 2
    k = torch.randn(1, kv, total + len(sel), d, generator=gen) * 2
    v = torch.randn(1, kv, total + len(sel), d, generator=gen)
    expected, _ = sdpa_attention_forward(module, q, k, v, sees[None, None], scaling=module.scaling)
    got, _ = split_attention_forward(module, q, k, v, sees[None, None], scaling=module.scaling)
    assert float((got - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-phi", "tiny-gemma3"])
def test_split_attention_equals_sdpa_under_a_batched_tree_of_orders(alias):
    """A decision-only readout's shape (`worker.engine.batched.rows_forward`): three batch rows whose
    notes are 300, 260 and 231 keys long (the shorter padded with keys no one sees), each with a
    common beginning of 20 inputs and then 6 orders of 40 side by side, each order seeing the
    beginning and itself only. Each row's notes are attended on their own, unmasked, and the new
    block 48 queries at a time against only the keys they see: the answer must not move."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from worker.engine.attention_plan import mask_plan
    from worker.engine.split_attention import split_attention_forward

    eng = load(alias)
    module = first_attention(eng.model)
    cfg = eng.model.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    notes, common, orders, each = [300, 260, 231], 20, 6, 40
    most, length = max(notes), common + orders * each
    group = torch.tensor([-1] * common + [o for o in range(orders) for _ in range(each)])
    tree = torch.ones(length, length, dtype=torch.bool).tril() & \
        ((group[:, None] == group[None, :]) | (group[None, :] == -1))
    sees = torch.zeros(len(notes), 1, length, most + length, dtype=torch.bool)
    for b, p in enumerate(notes):
        sees[b, 0, :, :p] = True
        sees[b, 0, :, most:] = tree
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(len(notes), heads, length, d, generator=gen) * 2
    k = torch.randn(len(notes), kv, most + length, d, generator=gen) * 2
    v = torch.randn(len(notes), kv, most + length, d, generator=gen)
    expected, _ = sdpa_attention_forward(module, q, k, v, sees, scaling=module.scaling)
    got, _ = split_attention_forward(module, q, k, v, sees, scaling=module.scaling)
    assert float((got - expected).abs().max()) <= 1e-5
    cut = mask_plan(sees, most, length, q.dtype, heads // kv)
    assert cut.row_keys == notes and cut.new_pieces is not None
    # each group of 48 queries reads the beginning and the (parts of) orders it spans, not the block
    assert max(len(block.cols) for block in cut.new_pieces) <= common + 48 + 2 * each < length
    pairs = sum((block.end - block.start) * len(block.cols) for block in cut.new_pieces)
    assert pairs < 0.45 * length * length
