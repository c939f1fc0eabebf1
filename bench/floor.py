"""The floor of each edit strategy: its FLOPs at the machine's measured matmul rate, plus one read
of the notes at its measured read bandwidth. A strategy's measured latency over its floor says how
much of its time is overhead; the ratio of floors is the best speed-up its token counts allow.

FLOPs of a forward of `new` tokens after `past` cached ones: 2 · (non-embedding parameters) per
token, 2 · vocab · hidden per position whose logits are kept, and 4 · heads · head_dim per
(query, key) pair per layer (QKᵀ and PV), every query seeing every cached key and the new block
causally. The readout (pending erratum + question + every choice's later tokens, one forward) is
counted for every strategy, recompute included.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Machine:
    gflops: float  # fp32 matmul rate at the model's MLP shape, torch threads as set
    read_gbs: float  # bandwidth of one pass over a large tensor


def measure_machine(hidden: int = 576, intermediate: int = 1536, repeats: int = 7) -> Machine:
    a, b = torch.randn(2048, hidden), torch.randn(hidden, intermediate)
    x = torch.randn(64 * 2**20)  # 256 MiB
    for _ in range(2):
        a @ b
        x.sum()
    mm, rd = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(8):
            a @ b
        mm.append((time.perf_counter() - t0) / 8)
        t0 = time.perf_counter()
        x.sum()
        rd.append(time.perf_counter() - t0)
    flops = 2 * a.shape[0] * hidden * intermediate
    return Machine(gflops=flops / statistics.median(mm) / 1e9,
                   read_gbs=x.numel() * 4 / statistics.median(rd) / 1e9)


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    head_dim: int
    vocab: int
    token_flops: float  # 2 · non-embedding parameters
    kv_bytes_per_token: int


def shape_of(model) -> Shape:
    c = model.config.get_text_config(decoder=True)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    params = sum(p.numel() for p in model.parameters()) - embed.numel()
    if head is not embed:
        params -= head.numel()  # the head runs only where logits are kept: counted via `vocab`
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    elem = torch.tensor([], dtype=model.dtype).element_size()
    return Shape(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, head_dim, c.vocab_size,
                 2.0 * params, 2 * c.num_hidden_layers * kv_heads * head_dim * elem)


def forward_flops(s: Shape, new: int, past: int, kept: int = 1) -> float:
    pairs = new * past + new * (new + 1) / 2
    return new * s.token_flops + kept * 2 * s.vocab * s.hidden + pairs * 4 * s.heads * s.head_dim * s.layers


@dataclass(frozen=True)
class EditShape:
    """The token counts of one edit: document tokens before/after, the common prefix, the changed
    tokens, the downstream reused tokens, the erratum, the question and the choices' later tokens."""

    old: int
    new: int
    prefix: int
    changed: int
    downstream: int
    erratum: int
    question: int
    branches: int  # Σ (tokens of each choice − 1), fed as branches in the readout
    choices: int
    selected: int  # selective's recomputed downstream tokens


def readout_flops(s: Shape, e: EditShape, past: int, pending: int) -> float:
    return forward_flops(s, pending + e.question + e.branches, past, kept=1 + e.branches)


def strategy_flops(s: Shape, e: EditShape) -> dict[str, float]:
    """FLOPs from cached notes to the decision, per edit strategy."""
    in_place = forward_flops(s, e.changed, e.prefix)
    ranking = forward_flops(s, e.downstream, e.prefix + e.changed) / s.layers  # layer 0 only
    mean_key = e.prefix + e.changed + e.downstream / 2  # a selected token's keys, on average
    selected = (e.selected * s.token_flops
                + e.selected * (mean_key + e.selected / 2) * 4 * s.heads * s.head_dim * s.layers)
    return {
        "recompute": forward_flops(s, e.new, 0) + readout_flops(s, e, e.new, 0),
        "prefix_reuse": forward_flops(s, e.new - e.prefix, e.prefix) + readout_flops(s, e, e.new, 0),
        "stale": readout_flops(s, e, e.old, 0),
        "in_place": in_place + readout_flops(s, e, e.new, 0),
        "erratum": readout_flops(s, e, e.old, e.erratum),
        "field_erratum": in_place + readout_flops(s, e, e.new, e.erratum),
        "selective": in_place + ranking + selected + readout_flops(s, e, e.new, 0),
    }


def floor_ms(m: Machine, flops: float, notes_bytes: int) -> float:
    return (flops / (m.gflops * 1e9) + notes_bytes / (m.read_gbs * 1e9)) * 1000
