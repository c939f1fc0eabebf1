"""A decision-only run's readouts (a sweep's edit past its timed sample) in as few forwards as pays.

Each strategy of such a run has notes of its own (the reference's from the field on, in_place's with
the field deferred, erratum's old notes with a correction appended, hoist's layout ...), and each
reads the same question over the same orders of its choices. One forward per strategy pays one pass
over the weights each (about 155 ms for smollm2-135m on a quiet 2-core VM, many times that on a
loaded one). So the readouts go through ONE batched forward (`rows_forward`): a batch row per
strategy, its own notes stacked beside the others' (shorter ones padded with zeros no one sees), its
deferred rows, appended tokens, questions and choices under its own tree mask
(`worker.engine.orders`), padded on the left so that every row's questions sit at the same indices
and the logits are read there only. Rows of very different lengths (selective's deferred tokens)
go in separate forwards where padding would cost more than a pass (`batches`). Each row reads what
`orders_forward` reads for it alone, up to float rounding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from worker.engine.decode import answer_all
from worker.engine.forward import Deferred, fill
from worker.engine.notes import KV, cache_from_layers
from worker.engine.orders import (
    _layout,
    _scores,
    _tree_mask,
    earliest_stop,
    over_orders,
    reading_orders,
    settled,
)
from worker.engine.readout import Frame, Readout, _choice_ids, _chosen, _per_order, decide
from worker.engine.selective import has_sliding_window
from worker.engine.types import Question


@dataclass(frozen=True)
class Row:
    """One readout of a batched `rows_forward`: its own cached notes `base` (per layer [1, kv, P, d]),
    the rows it defers to the readout and the tokens it appends (`shared`: an erratum)."""

    base: list[KV]
    shared: tuple[int, ...] = ()
    deferred: Deferred | None = None


@dataclass
class RowReading:
    """What `rows_forward` read for one `Row`: per order the logits [vocab] after its question and
    the choices' summed log-probabilities, and the deferred rows' fresh K/V (None without)."""

    heads: list[torch.Tensor]
    scores: list[list[float]]
    deferred_kv: list[KV] | None


def row_length(row: Row, suffixes: list[list[int]], encoded: list[list[int]]) -> int:
    """How many inputs `row` feeds to a `rows_forward`."""
    return len(_layout(0, list(row.shared), suffixes, encoded, row.deferred).inputs)


@torch.inference_mode()
def rows_forward(model, rows: Sequence[Row], suffixes: list[list[int]],
                 encoded: list[list[int]]) -> list[RowReading]:
    """What `orders_forward` reads for each row, for every row in ONE batched forward: each batch
    row attends to its own notes (stacked, shorter ones padded with masked zeros) under its own tree
    mask. Rows are padded on the LEFT (a pad input sees only itself and no one sees it), so every
    row's questions and choices sit at the same indices and the logits are read at those only."""
    past = [r.base[0][0].shape[2] for r in rows]
    layouts = [_layout(p, list(r.shared), suffixes, encoded, r.deferred) for p, r in zip(past, rows)]
    n_rows, length, most = len(rows), max(len(lay.inputs) for lay in layouts), max(past)
    device = model.device
    pads = [length - len(lay.inputs) for lay in layouts]
    inputs = torch.tensor([[0] * pad + lay.inputs for pad, lay in zip(pads, layouts)], device=device)
    positions = torch.tensor([[p] * pad + lay.positions for p, pad, lay in zip(past, pads, layouts)],
                             device=device)
    mask = torch.zeros(n_rows, 1, length, most + length, dtype=torch.bool, device=device)
    for b, (p, pad, lay, row) in enumerate(zip(past, pads, layouts, rows)):
        own = _tree_mask(p, row.deferred, lay.group, lay.parent, device)[0, 0]  # [L_b, p + L_b]
        mask[b, 0, pad:, :p] = own[:, :p]
        mask[b, 0, pad:, most + pad:] = own[:, p:]
        idx = torch.arange(pad, device=device)
        mask[b, 0, idx, most + idx] = True
        mask[b, 0, :pad, :p] = True  # a pad input also reads its row's notes: no one reads it, and every
        # query of the row then sees the same first keys (`split_attention` attends them unmasked)
    layers = []
    for i in range(len(rows[0].base)):
        k0, v0 = rows[0].base[i]
        keys = k0.new_zeros(n_rows, k0.shape[1], most, k0.shape[3])
        values = v0.new_zeros(n_rows, v0.shape[1], most, v0.shape[3])
        for b, (row, p) in enumerate(zip(rows, past)):
            keys[b, :, :p] = row.base[i][0][0]
            values[b, :, :p] = row.base[i][1][0]
        layers.append((keys, values))
    # the same kept indices in every row (left padding aligns them)
    shift = pads[0]
    keep = sorted(set(layouts[0].heads) | {r for rs in layouts[0].rows for r in rs})
    at = {row: i for i, row in enumerate(keep)}
    cache = cache_from_layers(layers, model)
    out = model(input_ids=inputs, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                logits_to_keep=torch.tensor([shift + r for r in keep], device=device))
    logits = out.logits.float()  # [rows, len(keep), vocab]
    readings = []
    for b, (pad, lay, row) in enumerate(zip(pads, layouts, rows)):
        mine = {r - (pad - shift): i for r, i in at.items()}  # this row's own indices, same kept rows
        n_def = len(row.deferred.positions) if row.deferred else 0
        fresh = None if not n_def else [(layer.tail_keys[b:b + 1, :, pad:pad + n_def],
                                         layer.tail_values[b:b + 1, :, pad:pad + n_def])
                                        for layer in cache.layers]
        heads = [logits[b, mine[h]] for h in lay.heads]
        readings.append(RowReading(heads, _scores(logits[b], mine, lay, encoded), fresh))
    return readings


# a forward's fixed cost, in inputs of its length: one pass over the weights whatever the length (about
# 155 ms for smollm2-135m on a quiet 2-core VM, some 60 inputs' worth; far more on a loaded machine)
FORWARD_INPUTS = 96


def batches(lengths: Sequence[int], fixed: int = FORWARD_INPUTS) -> list[list[int]]:
    """The rows (by index) of each batched forward: rows of similar length together, cut where one
    more forward costs less (`fixed`) than padding the short rows up to the long ones. A batched
    forward costs `fixed` plus its rows times its longest row."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = [0.0] + [float("inf")] * len(order)  # best[j]: the cost of the first j rows of `order`
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + fixed + (j - i) * lengths[order[j - 1]]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def order_chunks(total: int) -> list[int]:
    """How many orders each forward of a decision-only readout reads: first as many as a decision can
    be settled after (`earliest_stop`), then the rest `ORDERS_AFTER` at a time, while any row's
    decision is not settled. A forward costs a pass over the weights (`FORWARD_INPUTS`) on top of its
    inputs, so reading one order a time pays that pass per order."""
    first = earliest_stop(total)
    if first >= total:
        return [total]
    rest = [ORDERS_AFTER] * ((total - first) // ORDERS_AFTER)
    if (total - first) % ORDERS_AFTER:
        rest.append((total - first) % ORDERS_AFTER)
    return [first, *rest]


ORDERS_AFTER = 2  # one pair of orders a forward, once the first chunk left a decision open (docs/sweeps.md)


def _settled_rows(model, rows: Sequence[Row], suffixes: list[list[int]], encoded: list[list[int]],
                  listed: Sequence[Sequence[str]], at_once: bool = False) -> list[RowReading]:
    """What `rows_forward` reads for each row over the orders it needs: chunk by chunk
    (`order_chunks`), a row stops once its decision is `settled` (the choice leading after every
    order), so its scores cover the orders it read, the listed one first. A row's deferred rows are
    computed in the first chunk and written into its notes (`fill`: a deferring strategy's notes
    are its own) for the next; its appended tokens go again with each chunk. `at_once`: every order
    in one forward (when no decision is expected to settle early: one pass over the weights and one
    common beginning fewer)."""
    total, choices = len(suffixes), list(listed[0])
    got: list[RowReading | None] = [None] * len(rows)
    todo, current, start = list(range(len(rows))), list(rows), 0
    for size in ([total] if at_once else order_chunks(total)):
        read = rows_forward(model, [current[i] for i in todo], suffixes[start:start + size], encoded)
        for i, reading in zip(todo, read):
            if got[i] is None:
                got[i] = reading
                if reading.deferred_kv is not None:
                    row = current[i]
                    current[i] = Row(fill(row.base, row.deferred, reading.deferred_kv), row.shared)
            else:
                got[i].heads += reading.heads
                got[i].scores += reading.scores
        start += size
        todo = [i for i in todo if not settled(choices, _per_order(choices, got[i].scores), total)]
        if not todo:
            break
    return got  # type: ignore[return-value]


def decide_all(model, tokenizer, frame: Frame, rows: Sequence[Row], suffix_ids: list[int], question: Question,
               orders: Sequence[list[int]] = (), drafts: Sequence[Sequence[int]] = (),
               orders_at_once: bool = False) -> list[Readout]:
    """Each row's readout as `decide(..., orders_apart=False)` takes it (a run that times nothing):
    the row's notes `base`, its appended tokens `shared` and its deferred rows. A choice question
    read over its orders, on a model one mask carries: the rows go through as few batched forwards
    as pays (`batches`, `rows_forward`), each row seeing only its own notes, and each reads only as
    many orders as its decision needs (`_settled_rows`: the decision is the one every order gives;
    `Readout.orders_read`). A free answer: every row's tokens decoded in the same batched steps
    (`worker.engine.decode.answer_all`), after its guess at the answer in `drafts` where it has
    one (speculative: the same answer whatever the guess). Anything else, one `decide` each.
    `orders_at_once`: every order read in one forward, no stopping (a sweep whose edit before needed
    every order for every row: `Readout.orders_needed`); the decisions are the same either way."""
    if not question.choices and not question.cot:  # a free answer: every row decoded in the same steps
        return answer_all(model, tokenizer, frame, rows, suffix_ids, question, drafts)
    together = bool(question.choices) and not question.cot and bool(orders) and not has_sliding_window(model)
    out: list[Readout | None] = [None] * len(rows)
    if not together:
        return [decide(model, tokenizer, frame, cache_from_layers(r.base, model), suffix_ids, question,
                       pending=list(r.shared), deferred=r.deferred, orders=orders, orders_apart=False)
                for r in rows]
    suffixes = [list(suffix_ids), *[list(o) for o in orders]]
    encoded = _choice_ids(tokenizer, frame, question.choices)
    listed = reading_orders(question.choices)
    for group in batches([row_length(r, suffixes, encoded) for r in rows]):
        readings = _settled_rows(model, [rows[i] for i in group], suffixes, encoded, listed, orders_at_once)
        first_token_at = time.perf_counter()
        checkpoints = list(accumulate(order_chunks(len(suffixes))))
        for i, got in zip(group, readings):
            per_order = _per_order(question.choices, got.scores)
            read = over_orders(listed[:len(got.scores)], per_order, len(suffixes))
            readout = _chosen(read, got.heads[0], encoded, question, first_token_at, got.deferred_kv)
            readout.choice_logp = dict(zip(question.choices, got.scores[0]))
            readout.orders_needed = next(k for k in checkpoints if k >= len(per_order)
                                         or settled(question.choices, per_order[:k], len(suffixes)))
            out[i] = readout
    return out  # type: ignore[return-value]
