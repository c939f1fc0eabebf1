"""Choices scored over their orders (`worker.engine.orders`): every cyclic order of the choices in
one forward gives what asking each order alone gives, a reversed list of two choices reads the same
debiased distribution (both of its orders are scored), and a question whose answer follows a
position more than the document is flagged. Many choices are read in at most 8 balanced orders,
and the first token is one readout in the listed order, the other orders read after it."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from worker.engine import Field, Question, RunRequest, load
from worker.engine.notes import cache_from_layers
from worker.engine.orders import MAX_ORDERS, cyclic_orders, over_orders, position_word, reading_orders
from worker.engine.readout import decide, orders_suffixes
from worker.engine.strategies.measure import Bench

DOC = "Account record.\nstatus: active\nowner: Ada Lovelace\nOnly active accounts may log in.\n"
# one-letter choices: a random tiny model's distribution over them is not saturated at 0 and 1
QUESTION = Question("Which letter?", ("a", "b", "c"))


def test_cyclic_orders_put_every_choice_in_every_position_once():
    orders = cyclic_orders(("a", "b", "c"))
    assert orders == [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")]
    for position in range(3):
        assert sorted(order[position] for order in orders) == ["a", "b", "c"]
    both = reading_orders(("a", "b", "c"))  # and the reversed list's cyclic orders: all 6 for three
    assert both[::2] == orders and sorted(both) == sorted(set(both)) and len(both) == 6  # interleaved
    assert reading_orders(("a", "b")) == [("a", "b"), ("b", "a")] and len(reading_orders("abcd")) == 8
    assert sorted(reading_orders(("c", "b", "a"))) == sorted(both)  # a reversed list: the same orders
    assert [position_word(i, 3) for i in range(3)] == ["first", "second", "last"]
    assert position_word(0, 1) == "first" and position_word(11, 12) == "last"
    assert position_word(10, 12) == "11th"


def test_over_orders_averages_and_flags_an_answer_that_follows_the_first_position():
    orders = cyclic_orders(("Tromso", "Valencia"))
    # the first listed choice wins in both orders: the answer follows the order, not the document
    first = over_orders(orders, [{"Tromso": 0.98, "Valencia": 0.02}, {"Valencia": 0.76, "Tromso": 0.24}])
    assert first.probs == pytest.approx({"Tromso": 0.61, "Valencia": 0.39})
    assert first.spread == {"Tromso": [0.24, 0.98], "Valencia": [0.02, 0.76]}
    assert first.bias == "first"
    # the same choice wins in both orders: it follows the document
    document = over_orders(orders, [{"Tromso": 0.01, "Valencia": 0.99}, {"Valencia": 0.98, "Tromso": 0.02}])
    assert document.bias is None and document.probs["Valencia"] == pytest.approx(0.985)
    # 3 choices, the last position wins in every order
    three = cyclic_orders(("x", "y", "z"))
    last = [{o[0]: 0.2, o[1]: 0.1, o[2]: 0.7} for o in three]
    assert over_orders(three, last).bias == "last"
    assert over_orders(three[:1], last[:1]).bias is None  # one order read: nothing to compare


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])  # one forward; sliding: one by one
def test_every_order_at_once_reads_what_each_order_alone_reads(alias):
    eng = load(alias)
    notes = eng.prefill(DOC)
    erratum = eng.encode("\n[STATE UPDATE] status is now closed.\n")
    suffix = eng.encode(eng.frame.suffix(QUESTION))
    orders = orders_suffixes(eng.tokenizer, eng.frame, QUESTION)
    assert len(orders) == 5  # three choices: all 6 orders, the listed one given apart
    for pending in ([], erratum):
        both = decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(notes.layers, eng.model),
                      suffix, QUESTION, pending=pending, orders=orders)
        alone = []
        for order in reading_orders(QUESTION.choices):
            asked = replace(QUESTION, choices=order)
            cache = cache_from_layers(notes.layers, eng.model)
            asked_ids = eng.encode(eng.frame.suffix(asked))
            alone.append(decide(eng.model, eng.tokenizer, eng.frame, cache, asked_ids, asked,
                                pending=pending).choice_probs)
        for choice in QUESTION.choices:
            per_order = [probs[choice] for probs in alone]
            assert both.choice_probs[choice] == pytest.approx(sum(per_order) / 6, abs=1e-5)
            low, high = both.choice_spread[choice]
            assert (low, high) == pytest.approx((min(per_order), max(per_order)), abs=1e-5)
        assert abs(sum(both.choice_probs.values()) - 1) < 1e-6
        assert both.decision == max(both.choice_probs, key=both.choice_probs.get)


@pytest.mark.parametrize(("alias", "choices"), [("tiny-llama", ("active", "suspended")),
                                               ("tiny-gemma3", ("active", "suspended")),
                                               ("tiny-llama", ("active", "suspended", "closed"))])
def test_a_reversed_list_of_choices_reads_the_same_debiased_distribution(alias, choices):
    eng = load(alias)
    start = DOC.index("active")
    field = (Field(start, start + 6, "suspended", "status"),)
    strategies = ("recompute", "stale", "erratum")
    reports = [eng.run(RunRequest(DOC, Question("What is the status?", listed), fields=field,
                                  strategies=strategies))
               for listed in (choices, tuple(reversed(choices)))]
    listed, reversed_ = (r.strategies for r in reports)
    for name in strategies:
        for choice in choices:
            assert listed[name].choice_probs[choice] == pytest.approx(reversed_[name].choice_probs[choice],
                                                                      abs=1e-5), name
            assert listed[name].choice_spread[choice] == pytest.approx(reversed_[name].choice_spread[choice],
                                                                       abs=1e-5), name
        assert listed[name].decision == reversed_[name].decision
        assert listed[name].order_bias == reversed_[name].order_bias


def test_a_bench_scores_the_frame_s_choice_questions_over_their_orders_only():
    eng = load("tiny-llama")

    def bench(question: Question, suffix: str | None = None) -> Bench:
        return Bench(eng, question, eng.encode(suffix if suffix is not None else eng.frame.suffix(question)))

    assert len(bench(QUESTION).orders) == 5
    assert bench(Question("Which letter?")).orders == []  # a free answer
    assert bench(Question("Which letter?", ("a",))).orders == []  # one choice, one order
    assert bench(replace(QUESTION, cot=True)).orders == []  # the reasoning is one generation
    assert bench(QUESTION, "\n\nQuestion: my own words\nAnswer:").orders == []  # a custom suffix


def test_many_choices_are_read_in_8_balanced_orders_at_a_cost_linear_in_the_choices():
    thirteen = tuple(f"c{i}" for i in range(13))
    orders = reading_orders(thirteen)
    assert len(orders) == MAX_ORDERS == 8 and len(set(orders)) == 8 and orders[0] == thirteen
    for choice in thirteen:  # every choice read first as often as it is read last
        assert sum(o[0] == choice for o in orders) == sum(o[-1] == choice for o in orders)
    assert all(sorted(o) == sorted(thirteen) for o in orders)
    eng = load("tiny-llama")
    for n in (5, 9, 13):
        question = Question("Which?", thirteen[:n])
        one = len(eng.encode(eng.frame.suffix(question)))
        others = orders_suffixes(eng.tokenizer, eng.frame, question)
        # 7 other orders whatever the number of choices, each as long as the listed question (give
        # or take a token where a permuted list tokenizes differently): linear in n, where all 2n
        # orders cost 2n - 1 questions of length ~n
        assert len(others) == 7 and abs(sum(map(len, others)) - 7 * one) <= 7


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-gemma3"])
def test_the_first_token_is_one_readout_in_the_listed_order_and_the_orders_come_after(alias):
    eng = load(alias)
    notes = eng.prefill(DOC)
    suffix = eng.encode(eng.frame.suffix(QUESTION))
    orders = orders_suffixes(eng.tokenizer, eng.frame, QUESTION)
    listed = decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(notes.layers, eng.model), suffix,
                    QUESTION)
    t0 = time.perf_counter()
    both = decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(notes.layers, eng.model), suffix,
                  QUESTION, orders=orders)
    done = time.perf_counter()
    assert torch.allclose(both.logits, listed.logits, atol=1e-5)  # the first token is the listed order's
    assert listed.measure_ms == 0.0 and both.measure_ms > 0
    # the orders are read after the first token, and their time is what follows it
    assert t0 < both.first_token_at and both.first_token_at + both.measure_ms / 1000 <= done + 1e-6
    assert set(both.choice_probs) == set(QUESTION.choices) and len(both.choice_spread) == 3
