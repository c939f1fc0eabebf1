"""The attention path CUDA takes, run on the CPU: SDPA over the joined notes (`install(model,
joined=True)`) against the split CPU kernels, on every tiny family and every mask kind a run uses
(plain causal after cached notes, one decoding token, the readout's block mask, a CacheBlend-style
scattered mask, sliding windows in the windowed families), within 1e-5. And the device audit:
every tensor the engine makes names the model's device, and no `.cpu()` sits in a hot path."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.engine.conftest import QUESTION, TEXT, attention_case, forward, max_diff
from worker.engine import Field, Question, load
from worker.engine.split_attention import install, joins, split_attention_forward, splits_on_this_device
from worker.engine.store import KVStore
from worker.engine.tiny import TINY_MODELS

ALL_TINY = list(TINY_MODELS)
TOL = 1e-5
ENGINE = Path(__file__).resolve().parents[2] / "worker" / "engine"


def _both_paths(model, layers, ids, mask=None, positions=None):
    """(split, joined): logits and K/V of the same forward through each path."""
    install(model, joined=False)
    try:
        assert splits_on_this_device(model)
        split = forward(model, layers, ids, mask, positions)
        install(model, joined=True)
        assert joins(model) and not splits_on_this_device(model)
        joined = forward(model, layers, ids, mask, positions)
    finally:
        install(model)  # back to the default: split in float32 on the CPU
    return split, joined


def _block_mask(past: int):
    """The readout's shape: a shared prompt, then two branches side by side, each seeing the notes,
    the prompt and only itself (restarted positions)."""
    owner = torch.tensor([-1] * 4 + [0] * 3 + [1] * 2)
    n = len(owner)
    sees = (owner[:, None] == owner[None, :]) | (owner[None, :] == -1)
    mask = torch.cat([torch.ones(n, past, dtype=torch.bool),
                      torch.ones(n, n, dtype=torch.bool).tril() & sees], 1)
    positions = ([past + j for j in range(4)] + [past + 4 + j for j in range(3)]
                 + [past + 4 + j for j in range(2)])
    return [70, 71, 72, 73, 80, 81, 82, 90, 91], mask[None, None], positions


def _scattered_mask(past: int, ids: list[int]):
    """CacheBlend's shape: every third cached token recomputed, each seeing the cached tokens
    before it that are not recomputed and the recomputed ones up to itself."""
    sel = torch.arange(0, past, 3)
    is_sel = torch.zeros(past, dtype=torch.bool)
    is_sel[sel] = True
    sees_cache = (torch.arange(past)[None, :] < sel[:, None]) & ~is_sel[None, :]
    mask = torch.cat([sees_cache, sel[None, :] <= sel[:, None]], 1)[None, None]
    return [ids[int(j)] for j in sel], mask, sel.tolist()


@pytest.mark.parametrize("alias", ALL_TINY)
@pytest.mark.parametrize("kind", ["causal-long", "causal-short", "one-token", "block", "scattered"])
def test_the_cuda_path_equals_split_attention_within_1e_5(alias, kind):
    eng = load(alias)
    notes = eng.prefill(TEXT + " " + TEXT)
    ids = eng.tokenize_document(TEXT + " " + TEXT)[0]
    past = 24 if kind == "causal-long" else notes.n_tokens
    layers = [(k[:, :, :past], v[:, :, :past]) for k, v in notes.layers]
    mask = positions = None
    if kind == "causal-long":  # prefix_reuse: a long block after a short prefix (past the 16-token windows)
        new = ids[past:]
    elif kind == "causal-short":  # an erratum and the question after long notes
        new = ids[5:17]
    elif kind == "one-token":  # decoding
        new = ids[5:6]
    elif kind == "block":
        new, mask, positions = _block_mask(past)
    else:
        new, mask, positions = _scattered_mask(past, ids)
    split, joined = _both_paths(eng.model, layers, new, mask, positions)
    assert max_diff(joined, split) <= TOL


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-phi", "tiny-gemma3"])
@pytest.mark.parametrize("cached, new", [(40, 300), (300, 7)])
def test_the_joined_path_aligns_causal_rows_to_the_last_keys(alias, cached, new):
    """The attention function alone, mask None (what a plain causal forward after notes hands it):
    SDPA's `is_causal` would let query i see keys 0..i only; the joined path must match the
    lower-right causal mask transformers' own SDPA materialises."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    eng = load(alias)
    module, q, k, v, sees, expected = attention_case(eng.model, cached, new, seed=5)
    install(eng.model, joined=True)
    try:
        got, _ = split_attention_forward(module, q, k, v, None, scaling=module.scaling)
    finally:
        install(eng.model)
    assert float((got - expected).abs().max()) <= TOL
    top_left, _ = sdpa_attention_forward(module, q, k, v, None, scaling=module.scaling)
    assert float((top_left - expected).abs().max()) > 1e-2  # what the path did before: wrong


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_a_whole_run_on_the_cuda_path_decides_as_the_split_path(alias):
    eng = load(alias)
    start = TEXT.index("active")
    field = [Field(start, start + 6, "suspended", "status")]
    split = eng.edit(TEXT, field, QUESTION)
    install(eng.model, joined=True)
    try:
        joined = eng.edit(TEXT, field, QUESTION)
    finally:
        install(eng.model)
    for name, result in split.strategies.items():
        assert joined.strategies[name].decision == result.decision
        assert abs(joined.strategies[name].kl_to_recompute - result.kl_to_recompute) <= 1e-5


# ---- device placement ----------------------------------------------------------------------------

_FACTORIES = {torch.tensor, torch.ones, torch.zeros, torch.full, torch.arange, torch.empty, torch.randn,
              torch.as_tensor, torch.eye, torch.linspace}


class _DeviceGuard(TorchFunctionMode):
    """Records every tensor the engine's own code makes without naming a device: on CUDA such a
    tensor would be born on the CPU (a mismatch, or a copy per forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.unplaced: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and kwargs.get("device") is None:
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(str(ENGINE)):
                self.unplaced.add(f"{Path(caller).name}:{sys._getframe(1).f_lineno} {func.__name__}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])  # gemma3: the sliding-window readout
def test_every_tensor_a_run_makes_names_the_models_device(alias, tmp_path):
    eng = load(alias)
    start = TEXT.index("active")
    guard = _DeviceGuard()
    # with a store of its own, whatever an earlier test left on the cached engine: its writes are
    # checked every time (an xdist run met them only when another test had attached one)
    saved, eng.store = eng.store, KVStore(tmp_path / "kv", block_tokens=16)
    try:
        with guard:
            eng.edit(TEXT, [Field(start, start + 6, "suspended", "status")], QUESTION, attention=True)
            eng.edit(TEXT, [Field(start, start + 6, "suspended", "status")], Question("What is the status?"))
            eng.compose(TEXT, ["Answer in one word.\n"], QUESTION,
                        strategies=["splice", "seam", "epic", "selective", "prefix_reuse"])
        assert any((tmp_path / "kv").rglob("*.safetensors")), "the store wrote nothing"
    finally:
        eng.store = saved
    assert guard.unplaced == set()


def test_no_cpu_copy_in_a_hot_path():
    """`.cpu()` only where a result leaves the engine (attention maps, after the timings) or once
    per model (the RoPE layout)."""
    allowed = {"attention.py", "rope.py"}
    found = {path.name for path in ENGINE.rglob("*.py") if re.search(r"\.cpu\(\)", path.read_text())}
    assert found <= allowed, found - allowed
