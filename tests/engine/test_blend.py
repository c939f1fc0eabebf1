"""Composing a context from many skills (`Engine.compose` with strategies): what each strategy
recomputes, exactness of prefix_reuse, and CacheBlend's selective at 100% being recompute."""

from __future__ import annotations

import pytest

from worker.engine import EngineError, Question, load
from worker.engine.compose import lay_out

CONTEXT = "You will read three passages and answer a question.\n"
PASSAGES = ["Oslo\n\nOslo is the capital of Norway and sits at the head of a fjord.\n\n",
            "Madrid\n\nMadrid is the capital of Spain, on the river Manzanares.\n\n",
            "Lisbon\n\nLisbon is the capital of Portugal, on the Tagus estuary.\n\n"]
QUESTION = Question("Which city is the capital of Spain?", ("Madrid", "Oslo"))
ALL = ("splice", "seam", "epic", "selective", "prefix_reuse")


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-phi"])
def test_every_compose_strategy_recomputes_what_it_says(alias):
    eng = load(alias)
    context = eng.prefill(CONTEXT)
    skills = [eng.compile_skill(p) for p in PASSAGES]
    report = eng.compose(context, skills, QUESTION, strategies=ALL, epic_tokens=16, seam_tokens=4)
    layout = lay_out(context, skills, [context.n_tokens] * 3)
    n = len(layout.token_ids)
    r = report.strategies
    assert list(r) == ["recompute", *ALL]
    assert r["recompute"].tokens_computed == n == report.document_tokens
    assert r["splice"].tokens_computed == 0
    assert r["seam"].tokens_computed == 4 * 3 and r["epic"].tokens_computed == 16 * 3
    reused = n - context.n_tokens
    assert r["selective"].tokens_computed == -(-15 * reused // 100)  # ceil(15%)
    first_skill_end = layout.spans[0][1]
    assert r["prefix_reuse"].tokens_computed == n - first_skill_end
    assert r["prefix_reuse"].kl_to_recompute < 1e-6  # exact
    assert r["splice"].kl_to_recompute > 1e-5  # spliced notes are not the recomputed ones
    for name in ("seam", "epic", "selective"):  # repairing moves towards recompute
        assert r[name].kl_to_recompute < r["splice"].kl_to_recompute, name
    for result in r.values():
        assert 0 < result.ttft_ms <= result.latency_ms


def test_selective_at_100_percent_is_recompute():
    eng = load("tiny-llama")
    context = eng.prefill(CONTEXT)
    skills = [eng.compile_skill(p) for p in PASSAGES]
    report = eng.compose(context, skills, QUESTION, strategies=["selective"], selective_fraction=1.0)
    assert report.strategies["selective"].kl_to_recompute < 1e-8


def test_skills_keep_their_order_and_places():
    eng = load("tiny-llama")
    context = eng.prefill(CONTEXT)
    skills = [eng.compile_skill(p) for p in PASSAGES]
    layout = lay_out(context, skills, [context.n_tokens, 5, context.n_tokens])
    assert layout.order == (1, 0, 2)  # by position, then as given
    assert ([layout.token_ids[s:e] for s, e in layout.spans]
            == [tuple(skills[i].token_ids[1:]) for i in (1, 0, 2)])
    assert layout.token_ids[:5] == tuple(context.token_ids[:5])
    assert layout.segments.count("skill") == sum(s.n_tokens - 1 for s in skills)


def test_an_unknown_compose_strategy_is_named():
    eng = load("tiny-llama")
    with pytest.raises(EngineError, match="unknown compose strategy 'stale'"):
        eng.compose(CONTEXT, PASSAGES, QUESTION, strategies=["stale"])
