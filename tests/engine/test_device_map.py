"""Models bigger than one GPU: `device="auto"` spreads a model with accelerate's device map, each
layer's notes on that layer's device, and a model too big for the memory given is refused.

Why not two CPU "devices" here: torch has one CPU device (`cpu:1` is the same memory and the same
`torch.device("cpu")` to every tensor), and accelerate's `max_memory` keys are GPU indices, "cpu",
"mps" and "disk"; a map of "cpu" and "disk" offloads weights, which kvnotes refuses. So on the CPU
the map puts every layer on "cpu", and the test checks what does not need a second device: the
device map is honoured, notes (prefilled, and read back from the KV store) sit on each layer's
weight device, and the refusal. `scripts/gpu-check.sh` splits a tiny model over cuda:0 and the CPU
(`max_memory={0: …, "cpu": …}`), a real two-device map, when a GPU is at hand."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import QUESTION, TEXT
from worker.engine import Field, load
from worker.engine.devices import DeviceError, describe_device, layer_devices
from worker.engine.engine import no_store
from worker.engine.store import KVStore


def test_a_model_spread_with_a_device_map_keeps_each_layers_notes_on_its_device(tmp_path):
    eng = load("tiny-gemma3", device="auto", max_memory={"cpu": "2GiB"})
    assert eng.model.hf_device_map == {"": "cpu"}
    devices = layer_devices(eng.model)
    assert len(devices) == 3 and describe_device(eng.model) == "cpu"
    notes = eng.prefill(TEXT)
    assert [k.device for k, _ in notes.layers] == devices == [v.device for _, v in notes.layers]
    saved, eng.store = eng.store, KVStore(tmp_path / "kv", block_tokens=16)
    try:
        eng.prefill(TEXT)
        again = eng.prefill(TEXT)  # read back from the store
        assert eng.store.stats()["hits"] > 0
        assert [k.device for k, _ in again.layers] == devices
        assert max(float((a[0] - b[0]).abs().max()) for a, b in zip(again.layers, notes.layers)) <= 1e-5
    finally:
        eng.store = saved
    start = TEXT.index("active")
    report = eng.edit(TEXT, [Field(start, start + 6, "suspended", "status")], QUESTION,
                      strategies=["recompute", "prefix_reuse", "in_place"])
    assert report.device == "cpu" and report.strategies["prefix_reuse"].kl_to_recompute < 1e-6


def test_the_same_model_spread_or_not_gives_the_same_notes():
    spread, plain = load("tiny-llama", device="auto", max_memory={"cpu": "2GiB"}), load("tiny-llama")
    assert spread is not plain
    with no_store(spread), no_store(plain):  # the model alone, whatever store another test left
        a, b = spread.prefill(TEXT), plain.prefill(TEXT)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a.layers, b.layers))


def test_a_model_too_big_for_the_memory_given_is_refused():
    with pytest.raises(DeviceError, match="too big for the memory given .* offloaded to disk"):
        load("tiny-moe", device="auto", max_memory={"cpu": 10_000})


def test_max_memory_is_read_from_its_setting_form_with_clear_errors():
    from worker.engine.devices import parse_max_memory

    assert parse_max_memory("0=70GiB, 1=70GiB,cpu=200GiB") == {0: "70GiB", 1: "70GiB", "cpu": "200GiB"}
    assert parse_max_memory("") is None
    with pytest.raises(DeviceError, match="write DEVICE=AMOUNT"):
        parse_max_memory("gpu0=70GiB")
    with pytest.raises(DeviceError, match="'lots' is not a size"):
        parse_max_memory("cpu=lots")
