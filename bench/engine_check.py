"""The engine's maths on a device, for every tiny family: what `scripts/gpu-check.sh` runs on CUDA
(the unit tests assume the CPU; this is their device-independent core, with limits stated).

    .venv/bin/python bench/engine_check.py --device cuda [--out table.md]

Per family, on the device: prefix_reuse against recompute (float32 KL ≤ 1e-6, bfloat16 KL ≤ 1e-3),
keys re-rotated by Δ=37 against keys computed there (float32, ≤ 1e-4 of the largest key), the
attention after cached notes against transformers' own SDPA (≤ 1e-4 relative), every tensor the engine
makes born on the device; and a model spread over two devices (cuda:0 and the CPU, where there is a
GPU) with each layer's notes on its own device. Prints a markdown table; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from tests.engine.test_cuda_path import _DeviceGuard  # noqa: E402
from tests.engine.test_maths import PORTABLE, QUESTION, TEXT, max_rel_error  # noqa: E402
from worker.engine import Field, load  # noqa: E402
from worker.engine.devices import layer_devices  # noqa: E402
from worker.engine.notes import cache_from_layers  # noqa: E402
from worker.engine.tiny import TINY_MODELS  # noqa: E402

EDIT = Field(TEXT.index("active"), TEXT.index("active") + 6, "suspended", "status")
Row = tuple[str, str, float, float]  # family, check, value, limit


def _prefix_reuse(alias: str, device: str, dtype: str) -> float:
    report = load(alias, device=device, dtype=dtype).edit(TEXT, [EDIT], QUESTION,
                                                          strategies=["recompute", "prefix_reuse"])
    return report.strategies["prefix_reuse"].kl_to_recompute


@torch.inference_mode()
def _keys_at(eng, ids: list[int], first: int) -> list[torch.Tensor]:
    from transformers import DynamicCache

    cache = DynamicCache()
    pos = torch.arange(len(ids), device=eng.device)[None] + first
    eng.model(input_ids=torch.tensor([ids], device=eng.device), position_ids=pos, cache=cache, use_cache=True)
    return [layer.keys for layer in cache.layers]


def _rerotation(alias: str, device: str) -> float:
    eng = load(alias, device=device, dtype="float32")
    notes = eng.prefill(TEXT)
    return max_rel_error([k for k, _ in notes.shifted(37).layers], _keys_at(eng, notes.token_ids, 37))


@torch.inference_mode()
def _attention_vs_sdpa(alias: str, device: str) -> float:
    """The engine's attention after cached notes against transformers' SDPA: logits of 40 new tokens."""
    eng = load(alias, device=device, dtype="float32")
    model, notes = eng.model, eng.prefill(TEXT)
    new = torch.tensor([eng.encode(" Only accounts whose status is active may log in.")[:40]],
                       device=eng.device)
    ours = model(input_ids=new, cache=cache_from_layers(notes.layers, model), use_cache=True).logits.float()
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        theirs = model(input_ids=new, cache=cache_from_layers(notes.layers), use_cache=True).logits.float()
    finally:
        model.set_attn_implementation(previous)
    return float((ours - theirs).abs().max() / theirs.abs().max())


def _unplaced(alias: str, device: str) -> float:
    guard = _DeviceGuard()
    strategies = ({} if alias in PORTABLE
                  else {"strategies": ["recompute", "prefix_reuse", "stale", "erratum"]})
    with guard:
        load(alias, device=device).edit(TEXT, [EDIT], QUESTION, **strategies)
    for line in sorted(guard.unplaced):
        print(f"  tensor made off the device: {line}", file=sys.stderr)
    return float(len(guard.unplaced))


def _spread_check(device: str) -> list[Row]:
    """tiny-llama over cuda:0 and the CPU: 380,000 bytes on the GPU hold the embedding and layer 0
    in float32 (accelerate keeps room for one more layer), so layer 1 goes to the CPU (the map
    computed on the CPU: {embed_tokens: 0, layers.0: 0, layers.1: cpu, norm: cpu, lm_head: cpu}).
    Notes per layer on each layer's device, prefix_reuse still exact."""
    if not device.startswith("cuda"):
        return []
    eng = load("tiny-llama", device="auto", dtype="float32", max_memory={0: 380_000, "cpu": "4GiB"})
    devices = layer_devices(eng.model)
    notes = eng.prefill(TEXT)
    placed = [k.device for k, _ in notes.layers] == devices and len({str(d) for d in devices}) == 2
    report = eng.edit(TEXT, [EDIT], QUESTION, strategies=["recompute", "prefix_reuse"])
    print(f"  spread: {eng.model.hf_device_map}; report device {report.device}", file=sys.stderr)
    return [("tiny-llama", "spread over 2 devices: notes on each layer's device", float(not placed), 0.0),
            ("tiny-llama", "spread: prefix_reuse KL (float32)",
             report.strategies["prefix_reuse"].kl_to_recompute, 1e-6)]


def checks(device: str, families: list[str]) -> list[Row]:
    rows: list[Row] = []
    for alias in families:
        rows.append((alias, "prefix_reuse KL (float32)", _prefix_reuse(alias, device, "float32"), 1e-6))
        rows.append((alias, "prefix_reuse KL (bfloat16)", _prefix_reuse(alias, device, "bfloat16"), 1e-3))
        if alias in PORTABLE:
            rows.append((alias, "re-rotated keys Δ=37 (float32)", _rerotation(alias, device), 1e-4))
        rows.append((alias, "attention after notes vs SDPA", _attention_vs_sdpa(alias, device), 1e-4))
        rows.append((alias, "tensors made off the device", _unplaced(alias, device), 0.0))
    return rows + _spread_check(device)


def table(rows: list[Row], device: str) -> str:
    lines = [f"Engine checks on `{device}` ({torch.__version__}):\n",
             "| family | check | value | limit | ok |",
             "|---|---|---:|---:|:-:|"]
    lines += [f"| {a} | {c} | {v:.3g} | {lim:.0e} | {'yes' if v <= lim else '**no**'} |"
              for a, c, v, lim in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--families", default=",".join(TINY_MODELS), help="comma-separated tiny aliases")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    rows = checks(args.device, [f for f in args.families.split(",") if f])
    text = table(rows, args.device)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0 if all(v <= lim for _, _, v, lim in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
