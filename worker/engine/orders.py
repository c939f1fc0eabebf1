"""Choices scored over their orders, so that a decision measures the notes and not the list.

A small model asked "Answer with one of: Tromso, Valencia." tends to pick the choice listed first,
whatever the document says. So a choice question is asked in a balanced set of orders of its
choices (`reading_orders`), and each choice's probability is averaged over the orders: the debiased
distribution. Up to four choices that is EVERY cyclic order of the list and of the reversed list
(each choice in each position once per direction: 2, 6, 8 orders), which makes it exactly the same
whichever way the list is written (with one direction, reversing three choices on smollm2-135m's
shipment log moved a probability by 0.061). From five choices on it is `MAX_ORDERS` (8) orders: four
cyclic shifts spread evenly over the list and the reversal of each, so every choice that is read
first in one order is read last in its reversal (first and last equally often), and the cost stays
linear in the number of choices (all 2N orders cost quadratic: 26 orders and ~2,300 question tokens
for 13 choices).
The document's notes are shared by every order, and so are the tokens every order's question
begins with ("Question: … Answer with one of:", computed once); only the rest of each question and
the choices are computed per order, all orders side by side in ONE forward (a tree mask: each
order's question sees the notes, whatever the strategy appends and the common beginning, each
choice its own order's question and its own earlier tokens, with restarted positions).

Reading over the orders is measurement, not the strategy's time to first token: a strategy's
readout is one question in the listed order (`worker.engine.readout.decide`), and the other orders
are read after it, timed apart (`Readout.measure_ms`).

Beside each probability goes its spread over the orders ([min, max]), and the question is flagged
(`order_bias`, e.g. "first") when the answer follows a position more often than it follows the
document: more orders pick the choice at that position than pick the debiased decision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vocabulary.prefix import common_prefix
from worker.engine.forward import Deferred
from worker.engine.notes import KV, cache_from_layers

ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def cyclic_orders(choices: Sequence[str]) -> list[tuple[str, ...]]:
    """Every cyclic order of `choices`, the listed one first: (a, b, c), (b, c, a), (c, a, b)."""
    items = tuple(choices)
    return [items[k:] + items[:k] for k in range(len(items))]


MAX_ORDERS = 8  # a choice question is read in at most this many orders (linear cost in the choices)


def reading_orders(choices: Sequence[str]) -> list[tuple[str, ...]]:
    """The orders a choice question is asked in, the listed order first, each forward order followed
    by its reversal (interleaved, so a reading that stops early has read as many of one direction as
    of the other: `settled` stops only after whole pairs). Up to `MAX_ORDERS // 2` choices: every
    cyclic order of `choices`, each with its reversal (a cyclic order of the reversed list; two
    choices: 2 orders; three: all 6; four: 8). More choices: `MAX_ORDERS // 2` cyclic shifts spread
    evenly over the list, each with its reversal (each choice read first in one order is read last in
    its reversal), `MAX_ORDERS` orders in all."""
    items = tuple(choices)
    n = len(items)
    if 2 * n <= MAX_ORDERS:
        forward = cyclic_orders(items)
    else:
        half = MAX_ORDERS // 2
        forward = [items[k:] + items[:k] for k in sorted({round(i * n / half) % n for i in range(half)})]
    orders: list[tuple[str, ...]] = []
    for order in forward:
        for o in (order, tuple(reversed(order))):
            if o not in orders:
                orders.append(o)
    return orders


def position_word(position: int, n: int) -> str:
    """"first", "second", …, and "last" for the last of more than one."""
    if n > 1 and position == n - 1:
        return "last"
    return ORDINALS[position] if position < len(ORDINALS) else f"{position + 1}th"


@dataclass(frozen=True)
class OrderReading:
    """The choices read over their orders: `probs` averaged over the orders (the debiased
    distribution, in the listed order), `spread` each one's [min, max] over the orders, `bias` the
    position the answer follows more than the document (None when it follows the document)."""

    probs: dict[str, float]
    spread: dict[str, list[float]]
    bias: str | None
    orders: int = 1  # how many orders were read
    of: int = 1  # how many it is read in when no order is skipped: fewer read is a partial reading

    @property
    def partial(self) -> bool:
        """The reading stopped before its last order (its decision settled): `probs`, `spread` and
        `bias` cover only the orders read."""
        return self.orders < self.of


def over_orders(orders: Sequence[Sequence[str]], per_order: Sequence[dict[str, float]],
                of: int | None = None) -> OrderReading:
    """Combine each order's choice distribution (`per_order[k]` for `orders[k]`, listed order first);
    `of`: the orders a full reading reads (default: those given)."""
    listed = list(orders[0])
    n_orders = len(per_order)
    probs = {c: sum(p[c] for p in per_order) / n_orders for c in listed}
    spread = {c: [min(p[c] for p in per_order), max(p[c] for p in per_order)] for c in listed}
    bias = None
    if n_orders > 1:
        decision = max(probs, key=probs.get)
        picks = [max(p, key=p.get) for p in per_order]
        follows_document = sum(pick == decision for pick in picks)
        position, follows_position = Counter(
            list(order).index(pick) for order, pick in zip(orders, picks)).most_common(1)[0]
        if follows_position > follows_document:
            bias = position_word(position, len(listed))
    return OrderReading(probs, spread, bias, n_orders, max(of or n_orders, n_orders))


# a stop must hold by more than float rounding could move a sum of at most 8 numbers in [0, 1]
STOP_SLACK = 1e-9


def settled(listed: Sequence[str], per_order: Sequence[dict[str, float]], total: int) -> bool:
    """Whether the choice leading after the orders read (`per_order`, the first k of `total`) leads
    after all `total` of them, whatever the rest read. Each order still to read adds a number in
    [0, 1] to every choice's sum, so another choice gains at most 1 on the leader per order: the
    decision is settled when the leader's sum beats every other's by more than the orders left
    (`STOP_SLACK` over it, so float rounding cannot make a tie of it). The full average cannot then
    tie, so its tie-break (the first listed) cannot differ either; short of that margin, read on.
    A reading stops only after whole pairs (an order and its reversal, `reading_orders`), so what it
    averages is as balanced as the full reading."""
    left = total - len(per_order)
    if left <= 0:
        return True
    if len(per_order) % 2:
        return False
    sums = {c: sum(p[c] for p in per_order) for c in listed}
    leader = max(sums, key=sums.get)
    return all(sums[leader] - sums[c] > left + STOP_SLACK for c in listed if c != leader)


def earliest_stop(total: int) -> int:
    """The fewest orders after which a decision over `total` can be settled: the fewest whole pairs
    k with k > total − k (a margin over k orders is below k, and must exceed the total − k orders
    left)."""
    k = total // 2 + 1
    return min(total, k + k % 2)


def _tree_mask(past: int, deferred: Deferred | None, group: list[int], parent: list[int],
               device: torch.device) -> torch.Tensor:
    """[1, 1, L, past + L] visibility for rows in a tree of groups: a row sees the cached notes
    (but no stale K/V at a deferred position; a deferred row only the notes before it) and every
    earlier row of its own group or of a group above it. Group 0 is the root (the deferred rows)."""
    n_groups = len(parent)
    above = torch.eye(n_groups, dtype=torch.bool, device=device)
    for g in range(n_groups):
        p = parent[g]
        while p >= 0:
            above[g, p] = True
            p = parent[p]
    own = torch.tensor(group, device=device)
    length = len(group)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    new = causal & above[own][:, own]
    cached = torch.ones(length, past, dtype=torch.bool, device=device)
    if deferred is not None:
        pos, n_def = torch.tensor(deferred.positions, device=device), len(deferred.positions)
        cached[:, pos] = False
        cached[:n_def] &= torch.arange(past, device=device)[None, :] < pos[:, None]
    return torch.cat([cached, new], dim=1)[None, None]


@dataclass
class _Layout:
    """One readout's rows over every order: the inputs, their positions and tree groups, the row of
    each order's question end (`heads`) and, per order and choice, the rows of its tokens after the
    first (`rows`)."""

    inputs: list[int]
    positions: list[int]
    group: list[int]
    parent: list[int]
    heads: list[int]
    rows: list[list[int]]


def _layout(past: int, shared: list[int], suffixes: list[list[int]], encoded: list[list[int]],
            deferred: Deferred | None) -> _Layout:
    """The rows of `orders_forward` after `past` cached tokens: the deferred rows, the shared tokens,
    the tokens every order's question begins with ("Question: … Answer with one of:", once), then
    per order the rest of its question and every choice after it."""
    n_def = len(deferred.positions) if deferred else 0
    same = min((common_prefix(suffixes[0], s) for s in suffixes[1:]), default=0)
    same = min(same, min(len(s) for s in suffixes) - 1)  # every order keeps its last token, its head
    common = list(suffixes[0][:same])
    inputs = (list(deferred.ids) if deferred else []) + list(shared) + common
    positions = (list(deferred.positions) if deferred else []) + [past + j for j in range(len(shared) + same)]
    group, parent = [0] * n_def + [1] * (len(shared) + same), [-1, 0]
    heads: list[int] = []
    rows: list[list[int]] = []  # per order, per choice: the row of each of its tokens after the first
    for suffix in suffixes:
        order_group = len(parent)
        parent.append(1)
        start = past + len(shared)
        inputs += suffix[same:]
        positions += [start + j for j in range(same, len(suffix))]
        group += [order_group] * (len(suffix) - same)
        heads.append(len(inputs) - 1)
        for seq in encoded:
            parent.append(order_group)
            tail = seq[:-1]
            rows.append(list(range(len(inputs), len(inputs) + len(tail))))
            inputs += tail
            positions += [start + len(suffix) + j for j in range(len(tail))]
            group += [len(parent) - 1] * len(tail)
    return _Layout(inputs, positions, group, parent, heads, rows)


def _scores(logits: torch.Tensor, at: dict[int, int], layout: _Layout,
            encoded: list[list[int]]) -> list[list[float]]:
    """Per order, each choice's summed log-probability, read from `logits` [kept rows, vocab]: only
    the log-probabilities of the choices' own tokens, each a logit less its row's log-sum-exp (the
    whole log-softmax of every kept row is not written out)."""
    n_choices = len(encoded)
    rows, tokens = [], []
    for k, head in enumerate(layout.heads):
        for c, seq in enumerate(encoded):
            seq_rows = layout.rows[k * n_choices + c]
            rows += [at[head], *(at[r] for r in seq_rows)]
            tokens += [seq[0], *seq[1:len(seq_rows) + 1]]
    index = torch.tensor(rows, device=logits.device)
    norm = torch.logsumexp(logits, dim=-1)
    picked = logits[index, torch.tensor(tokens, device=logits.device)] - norm[index]
    values, i, scores = picked.double().tolist(), 0, []
    for _ in layout.heads:
        order_scores = []
        for seq in encoded:
            order_scores.append(sum(values[i:i + len(seq)]))
            i += len(seq)
        scores.append(order_scores)
    return scores


@torch.inference_mode()
def orders_forward(model, base: list[KV], shared: list[int], suffixes: list[list[int]],
                   encoded: list[list[int]], deferred: Deferred | None = None):
    """ONE forward after the cached `base`: the `deferred` rows, the `shared` tokens (an appended
    erratum), then per order its question `suffixes[k]` and every choice (`encoded`, token ids, the
    same in every order) after it. Returns per order the logits [vocab] after its question and the
    choices' summed log-probabilities (in `encoded`'s order), and the forward's cache (its tails:
    deferred rows first)."""
    past = base[0][0].shape[2] if base else 0
    layout = _layout(past, shared, suffixes, encoded, deferred)
    keep = sorted(set(layout.heads) | {r for rs in layout.rows for r in rs})
    at = {row: i for i, row in enumerate(keep)}
    cache = cache_from_layers(base, model) if base else None
    out = model(
        input_ids=torch.tensor([layout.inputs], device=model.device),
        position_ids=torch.tensor([layout.positions], device=model.device),
        attention_mask=_tree_mask(past, deferred, layout.group, layout.parent, model.device),
        cache=cache,
        use_cache=True,
        logits_to_keep=torch.tensor(keep, device=model.device),
    )
    logits = out.logits[0].float()  # [len(keep), vocab]
    scores = _scores(logits, at, layout, encoded)
    return [logits[at[h]] for h in layout.heads], scores, cache
