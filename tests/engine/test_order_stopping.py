"""A decision-only readout reads a choice question's orders only as far as its decision needs
(issue 42, item 3): `worker.engine.orders.settled` stops once no order left could change the
leading choice, so the decision is exactly the one every order gives, ties included."""

from __future__ import annotations

import random

import pytest

from worker.engine import Question, load
from worker.engine.batched import Row, decide_all, order_chunks, rows_forward
from worker.engine.orders import earliest_stop, over_orders, reading_orders, settled
from worker.engine.readout import _choice_ids, _per_order, orders_suffixes

CHOICES = tuple("abcdefghijklm")  # 13 choices: 8 orders


def _full_decision(choices, per_order) -> str:
    """What the full reading decides: `over_orders` over every order, the first listed of equal ones."""
    probs = over_orders([choices] * len(per_order), per_order).probs
    return max(probs, key=probs.get)


def _distribution(rng: random.Random, choices, sharpness: float) -> dict[str, float]:
    weights = [rng.random() ** sharpness for _ in choices]
    total = sum(weights)
    return {c: w / total for c, w in zip(choices, weights)}


def _stopped_decision(choices, per_order) -> tuple[str, int]:
    """The decision and orders read when reading stops at the first settled prefix."""
    for k in range(1, len(per_order) + 1):
        if settled(choices, per_order[:k], len(per_order)):
            return _full_decision(choices, per_order[:k]), k
    raise AssertionError("every order read is always settled")


def test_a_stopped_reading_decides_what_every_order_decides_over_many_cases():
    rng = random.Random(42)
    stops = []
    for case in range(4000):
        n = rng.choice([2, 3, 4, 5, 13])
        choices = CHOICES[:n]
        total = len(reading_orders(choices))
        sharp = rng.choice([0.5, 1, 4, 16, 64])  # flat to one choice near 1
        per_order = [_distribution(rng, choices, sharp) for _ in range(total)]
        if case % 5 == 0:  # a choice the remaining orders all turn to: a late swing
            late = rng.choice(choices)
            for k in range(total // 2, total):
                per_order[k] = {c: (1.0 if c == late else 0.0) for c in choices}
        decision, k = _stopped_decision(choices, per_order)
        assert decision == _full_decision(choices, per_order), (case, k)
        assert k >= earliest_stop(total)
        if total == 8:
            stops.append(k)
    # it does stop early, never before 6 of 8 (whole pairs: an order and its reversal), never at an odd count
    assert min(stops) == 6 and stops.count(8) < len(stops) and all(k % 2 == 0 for k in stops)


def test_the_bound_is_the_orders_left_and_no_less():
    # after 6 of 8 orders, a leads b by 2 in sum; two orders that give b everything tie them at 4:4,
    # and the full reading breaks the tie for the first listed, b here: so 6 orders are not enough
    choices = ("b", "a")
    first = [{"a": 1.0, "b": 0.0}] * 2 + [{"a": 0.5, "b": 0.5}] * 4
    assert not settled(choices, first, 8)
    swing = first + [{"a": 0.0, "b": 1.0}] * 2
    assert _full_decision(choices, swing) == "b"
    # a hair more than the orders left, and nothing left can change it
    ahead = [{"a": 1.0, "b": 0.0}] * 2 + [{"a": 0.5, "b": 0.5}] * 3 + [{"a": 0.5001, "b": 0.4999}]
    assert settled(choices, ahead, 8)
    assert _full_decision(choices, ahead + [{"a": 0.0, "b": 1.0}] * 2) == "a"
    # five orders far ahead are never settled: an order without its reversal is half a pair
    assert not settled(choices, [{"a": 1.0, "b": 0.0}] * 5, 8)


def test_an_exact_tie_reads_every_order_and_keeps_the_full_tie_break():
    choices = ("x", "y", "z")
    per_order = [{"x": 0.5, "y": 0.5, "z": 0.0}, {"x": 0.5, "y": 0.5, "z": 0.0}] * 3
    assert not any(settled(choices, per_order[:k], 6) for k in range(1, 6))
    assert _stopped_decision(choices, per_order) == ("x", 6) == (_full_decision(choices, per_order), 6)


@pytest.mark.parametrize("total, chunks", [(2, [2]), (6, [4, 2]), (8, [6, 2]), (4, [4])])
def test_orders_are_read_from_the_earliest_stop_on(total, chunks):
    assert order_chunks(total) == chunks and sum(chunks) == total


@pytest.mark.parametrize("n_choices", [3, 13])
def test_batched_stopping_readouts_decide_what_reading_every_order_decides(n_choices):
    eng = load("tiny-llama")
    question = Question("Which one is it?", CHOICES[:n_choices])
    suffix = eng.encode(eng.frame.suffix(question))
    orders = orders_suffixes(eng.tokenizer, eng.frame, question)
    encoded = _choice_ids(eng.tokenizer, eng.frame, question.choices)
    listed = reading_orders(question.choices)
    for text in ("The answer is a, plainly.", "Nobody knows; maybe m or c.", "d d d d d d d d d d."):
        notes = eng.prefill(text)
        rows = [Row(notes.layers), Row(notes.layers, tuple(eng.encode(" Correction: it is b.")))]
        got = decide_all(eng.model, eng.tokenizer, eng.frame, rows, suffix, question, orders)
        full = rows_forward(eng.model, rows, [suffix, *orders], encoded)
        for readout, every in zip(got, full):
            assert readout.decision == _full_decision(listed[0], _per_order(question.choices, every.scores))
            assert earliest_stop(len(listed)) <= readout.orders_read <= len(listed)
            assert readout.orders_needed == readout.orders_read and readout.orders_total == len(listed)
        # every order in one forward (a sweep whose edit before needed them all): the same decisions,
        # every order read, and what the stopping reading needed still said
        at_once = decide_all(eng.model, eng.tokenizer, eng.frame, rows, suffix, question, orders,
                             orders_at_once=True)
        for one, stopped in zip(at_once, got):
            assert one.decision == stopped.decision and one.orders_read == len(listed)
            assert one.orders_needed == stopped.orders_read


@pytest.mark.parametrize("choices", [("a", "b"), ("a", "b", "c"), tuple("abcd"), tuple("abcdefghijklm")])
def test_forward_and_reversed_orders_alternate_so_a_stopped_reading_is_balanced(choices):
    """Issue 51 item 11: the orders alternate, each forward order followed by its reversal, so every
    stop (after whole pairs) has read as many orders of one direction as of the other, and each
    choice as often first as last."""
    orders = reading_orders(choices)
    assert orders[0] == choices
    for k in range(0, len(orders) - 1, 2):
        assert orders[k + 1] == tuple(reversed(orders[k]))
    for stop in range(earliest_stop(len(orders)), len(orders) + 1, 2):
        read = orders[:stop]
        for c in choices:
            assert sum(o[0] == c for o in read) == sum(o[-1] == c for o in read), (stop, c)


def test_a_stopped_reading_is_marked_partial():
    """A reading that stopped before its last order says so: `OrderReading.partial` and the
    readout's and result's `orders_read` below `orders_total` (the page marks the cell)."""
    choices = ("a", "b", "c")
    sure = [{"a": 1.0, "b": 0.0, "c": 0.0}] * 4
    assert settled(choices, sure, 6)
    reading = over_orders(reading_orders(choices)[:4], sure, 6)
    assert (reading.orders, reading.of, reading.partial) == (4, 6, True)
    full = over_orders(reading_orders(choices), sure + sure[:2], 6)
    assert (full.orders, full.of, full.partial) == (6, 6, False)
    eng = load("tiny-llama")
    question = Question("Which one is it?", choices)
    suffix = eng.encode(eng.frame.suffix(question))
    orders = orders_suffixes(eng.tokenizer, eng.frame, question)
    notes = eng.prefill("The answer is a, plainly. a a a a a a a a a.")
    (got,) = decide_all(eng.model, eng.tokenizer, eng.frame, [Row(notes.layers)], suffix, question, orders)
    assert got.orders_total == 6 and got.orders_read in (4, 6)
    assert (got.orders_read < got.orders_total) == (got.orders_read == 4)
