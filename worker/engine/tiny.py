"""Tiny random models, one per attention / RoPE family the engine must handle, for the unit tests.

Each is built from a config with a fixed seed (a few layers, a handful of heads) and they share one
byte-level tokenizer built in code (3 specials + 256 bytes, with character offsets), so the maths
tests need no files and run in seconds. `tiny-gpt2` (no RoPE) and `tiny-dynamic` (dynamic NTK) exist
to prove that the engine refuses to re-position what cannot be re-positioned.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

TINY_SEED = 0
TINY_VOCAB = 272  # 3 specials + 256 bytes, rounded up to a multiple of 16
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_OFFSET = 3


def _byte_to_unicode() -> list[str]:
    """GPT-2's printable stand-in for each byte value (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per UTF-8 byte (no merges), `<s>` prepended to every text.

    Offsets (`return_offsets_mapping=True`) are character spans of the input; the bytes of one
    multi-byte character all map to that character's span.
    """
    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID}
    for byte, ch in enumerate(_byte_to_unicode()):
        vocab[ch] = BYTE_OFFSET + byte  # token id = 3 + byte value
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=8192
    )


def _common(**overrides) -> dict:
    """Shared shape of every tiny model: 2 layers, hidden 64, 4 heads of 16, 2 kv heads."""
    base = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        initializer_range=0.2,  # large enough that attention is far from uniform
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )
    base.update(overrides)
    return base


def _tiny_llama() -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(**_common())


def _tiny_qwen3() -> PretrainedConfig:
    from transformers import Qwen3Config

    return Qwen3Config(**_common())  # q_norm / k_norm before RoPE


def _tiny_mistral() -> PretrainedConfig:
    from transformers import MistralConfig

    return MistralConfig(**_common(sliding_window=16))


def _tiny_gemma3() -> PretrainedConfig:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_common(
            num_hidden_layers=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            sliding_window=16,
            query_pre_attn_scalar=16,
            tie_word_embeddings=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            },
        )
    )


def _tiny_phi() -> PretrainedConfig:
    from transformers import PhiConfig

    return PhiConfig(
        **_common(
            num_key_value_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5},
        )
    )


def _tiny_llama3() -> PretrainedConfig:
    from transformers import LlamaConfig

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    return LlamaConfig(**_common(rope_parameters=rope))


def _tiny_yarn() -> PretrainedConfig:
    from transformers import LlamaConfig

    rope = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0,
            "original_max_position_embeddings": 2048}
    return LlamaConfig(**_common(rope_parameters=rope))


def _tiny_moe() -> PretrainedConfig:
    from transformers import MixtralConfig

    return MixtralConfig(**_common(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64))


def _tiny_gpt2() -> PretrainedConfig:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=TINY_VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=8192,
        initializer_range=0.2,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def _tiny_dynamic() -> PretrainedConfig:
    from transformers import LlamaConfig

    # Dynamic NTK changes the frequencies with the sequence length: cached keys cannot be re-rotated.
    rope = {"rope_type": "dynamic", "rope_theta": 10_000.0, "factor": 2.0}
    return LlamaConfig(**_common(rope_parameters=rope, max_position_embeddings=8192))


# alias -> (family, description, config builder)
TINY_MODELS: dict[str, tuple[str, str, Callable[[], PretrainedConfig]]] = {
    "tiny-llama": ("llama", "Llama, GQA, default RoPE", _tiny_llama),
    "tiny-qwen3": ("qwen3", "Qwen3, q/k RMS-norm before RoPE", _tiny_qwen3),
    "tiny-mistral": ("mistral", "Mistral, sliding window 16", _tiny_mistral),
    "tiny-gemma3": ("gemma3_text", "Gemma 3, sliding (base 10k) and full (base 1e6) layers", _tiny_gemma3),
    "tiny-phi": ("phi", "Phi, partial rotary (factor 0.5)", _tiny_phi),
    "tiny-llama3": ("llama", "Llama, llama3 RoPE scaling", _tiny_llama3),
    "tiny-yarn": ("llama", "Llama, YaRN RoPE (factor 4, original 2048)", _tiny_yarn),
    "tiny-moe": ("mixtral", "Mixtral, 4 experts, top-2", _tiny_moe),
    "tiny-gpt2": ("gpt2", "GPT-2, learned absolute positions (no RoPE)", _tiny_gpt2),
    "tiny-dynamic": ("llama", "Llama, dynamic NTK RoPE (cannot be re-positioned)", _tiny_dynamic),
}


def load_tiny(alias: str, device: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    family, _, build = TINY_MODELS[alias]
    config = build()
    torch.manual_seed(TINY_SEED)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval(), byte_tokenizer()
