"""Where a model runs and in what precision: the device ("cpu", "cuda:1", or "auto": spread layer by
layer over the GPUs with accelerate's device map) and the dtype (float32, bfloat16, float16), each
checked with an error a person can act on (a device that is not there, a dtype the device cannot run,
a model too big for the memory given), and how a run names them in its report.

A model spread over devices keeps each layer's notes on that layer's device (`layer_devices`): the
K/V a layer writes are born there, and notes read back from the KV store are placed there.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from vocabulary import SPREAD
from worker.engine.types import EngineError


class DeviceError(EngineError):
    """A device that is not there, a dtype the device cannot run, or a model too big for the memory
    given."""


# The dtypes a model can run in (`KVNOTES_DTYPE`, `--dtype`).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16
}
AUTO = SPREAD  # the device that spreads a model over every GPU (then the CPU): accelerate's device_map




def resolve_device(device: str | None) -> str:
    """`device`, checked: "cpu", "cuda", "cuda:N", "auto" (spread over the GPUs) or any torch device
    that is there; None or "" picks CUDA when available, else the CPU."""
    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == AUTO:
        return device
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise DeviceError(f"device {device!r} is not there: torch {torch.__version__} sees no CUDA "
                              "device (a CPU build, or no GPU); use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise DeviceError(f"device {device!r} is not there: torch sees {count} CUDA device(s), "
                              f"cuda:0 to cuda:{count - 1}")
    elif dev.type != "cpu":
        try:
            torch.empty(1, device=dev)
        except (RuntimeError, AssertionError) as exc:
            raise DeviceError(f"device {device!r} is not there: {str(exc).splitlines()[0]}") from None
    return device


def default_dtype(device: str) -> torch.dtype:
    """bfloat16 on CUDA (and when spread over GPUs), float32 on the CPU."""
    on_gpu = device.startswith("cuda") or (device == AUTO and torch.cuda.is_available())
    return torch.bfloat16 if on_gpu else torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """`dtype` by name ("float32", "bfloat16", "float16") or as a torch dtype, checked against what
    `device` can run; None or "" gives the device's default (`default_dtype`)."""
    if dtype is None or dtype == "":
        return default_dtype(device)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise DeviceError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise DeviceError(f"dtype {dtype_name(dtype)} is not supported: use {', '.join(DTYPES)}")
    if dtype == torch.bfloat16 and device.startswith("cuda") and not torch.cuda.is_bf16_supported(False):
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        raise DeviceError(f"{device} cannot run bfloat16 (compute capability {major}.{minor}; bfloat16 needs "
                          "8.0 or newer): use --dtype float16 or float32")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16: the word reports and settings use."""
    return str(dtype).removeprefix("torch.")


def layer_devices(model: PreTrainedModel) -> list[torch.device]:
    """The device of each decoder layer's weights, in layer order: where that layer's notes live
    (one device unless the model was spread with `device="auto"`)."""
    layers = _decoder_layers(model)
    if layers is None:
        return [model.device] * model.config.get_text_config(decoder=True).num_hidden_layers
    return [next(layer.parameters()).device for layer in layers]


def _decoder_layers(model: PreTrainedModel):
    for name in ("model.layers", "transformer.h", "model.decoder.layers"):
        module = model
        for part in name.split("."):
            module = getattr(module, part, None)
        if module is not None:
            return module
    return None


def describe_device(model: PreTrainedModel) -> str:
    """The device a model runs on, e.g. "cpu", "cuda:0", or "cuda:0+cuda:1" when spread."""
    devices = list(dict.fromkeys(str(d) for d in layer_devices(model)))
    return "+".join(devices) if devices else str(model.device)


def spread(model: PreTrainedModel, name: str, max_memory: dict | None) -> PreTrainedModel:
    """A model already in memory, dispatched layer by layer over the devices of `max_memory`."""
    from accelerate import dispatch_model, infer_auto_device_map

    device_map = infer_auto_device_map(model, max_memory=max_memory,
                                       no_split_module_classes=model._no_split_modules or [])
    check_fits(name, device_map, max_memory)
    model = dispatch_model(model, device_map)
    model.hf_device_map = device_map
    return model


def check_fits(name: str, device_map: dict, max_memory: dict | None) -> None:
    """Refuse a device map that sends weights to disk or nowhere: too big for the memory given."""
    offloaded = [module for module, where in device_map.items() if where in ("disk", "meta")]
    if offloaded:
        raise DeviceError(f"model {name!r} is too big for the memory given ({max_memory or 'every device'}): "
                          f"{len(offloaded)} of its modules would be offloaded to disk; give more memory, "
                          "more GPUs or a smaller dtype")


def on_layer_devices(layers: list[tuple[torch.Tensor, torch.Tensor]], model: PreTrainedModel,
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Stored notes ([kv_heads, T, head_dim] per layer, as the KV store returns them) with the batch
    dimension back, each layer's on the device of that layer's weights."""
    devices = layer_devices(model)
    return [(k.unsqueeze(0).to(d), v.unsqueeze(0).to(d)) for (k, v), d in zip(layers, devices)]


def parse_max_memory(text: str) -> dict[int | str, str] | None:
    """`KVNOTES_MAX_MEMORY` / `--max-memory`: "0=70GiB,1=70GiB,cpu=200GiB" → {0: "70GiB", 1: "70GiB",
    "cpu": "200GiB"} (GPU indices, "cpu" or "mps"); "" → None (accelerate's own estimate)."""
    from accelerate.utils import convert_file_size_to_int

    if not text.strip():
        return None
    out: dict[int | str, str] = {}
    for part in text.split(","):
        device, sep, amount = part.strip().partition("=")
        device, amount = device.strip(), amount.strip()
        if not sep or not amount or not (device.isdigit() or device in ("cpu", "mps")):
            raise DeviceError(f"max memory {part.strip()!r}: write DEVICE=AMOUNT, e.g. 0=70GiB,cpu=200GiB "
                              "(DEVICE a GPU index, cpu or mps)")
        try:
            convert_file_size_to_int(amount)
        except ValueError:
            raise DeviceError(
                f"max memory {part.strip()!r}: {amount!r} is not a size (e.g. 70GiB, 500MB)"
            ) from None
        out[int(device) if device.isdigit() else device] = amount
    return out
