"""Behaviour on the bundled real models (slow: they load real weights, converted once).

What these assert was chosen by measuring, not by tuning until green: on SmolLM2-135M the notes
effect shows on read-back questions. How often in_place / erratum / field_erratum agree with
recompute is a benchmark number (docs/benchmarks.md), never an assertion here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from worker.engine import Field, Question, load

pytestmark = pytest.mark.slow

SHIPMENT = ("Shipment 4471\ndestination: Oslo\ncarrier: DHL\nweight: 12 kg\n"
            "The shipment leaves the warehouse on Monday morning.\n")
FRENCH = "Style guide: answer in French, in one short sentence.\n"


@pytest.fixture(scope="module")
def smollm2(data_dir):
    return load("smollm2-135m", device="cpu", data_dir=data_dir)


def test_stale_notes_keep_the_old_decision_when_recompute_flips(data_dir):
    """On gemma3-270m, which reads this field back in either order of the choices: smollm2-135m's
    stale notes here pick whichever city is listed first, so read over every order they say Madrid
    (the run page flags such a question)."""
    gemma = load("gemma3-270m", device="cpu", data_dir=data_dir)
    start = SHIPMENT.index("Oslo")
    question = Question("What is the destination of shipment 4471?", ("Oslo", "Madrid"))
    before = gemma.edit(SHIPMENT, [], question, strategies=["recompute"]).strategies["recompute"]
    report = gemma.edit(SHIPMENT, [Field(start, start + 4, "Madrid", "destination")], question,
                          strategies=["recompute", "prefix_reuse", "stale"])
    after = report.strategies
    assert before.decision == "Oslo"
    assert after["recompute"].decision == "Madrid"  # the field flips the decision under recompute
    assert after["stale"].decision == "Oslo"  # the old notes keep the old one
    assert not after["stale"].decision_matches_recompute
    assert after["prefix_reuse"].decision == "Madrid" and after["prefix_reuse"].kl_to_recompute < 1e-6


@pytest.mark.parametrize("at", [None, SHIPMENT.index("carrier")])
def test_a_skill_spliced_with_its_start_token_sink_is_closer_to_recompute(smollm2, at):
    question = Question("Where does the shipment go?")
    with_sink = smollm2.compose(SHIPMENT, [smollm2.compile_skill(FRENCH)], question, at=at)
    without = smollm2.compose(SHIPMENT, [smollm2.compile_skill(FRENCH, sink=False)], question, at=at)
    kl_sink = with_sink.strategies["splice"].kl_to_recompute
    kl_bare = without.strategies["splice"].kl_to_recompute
    assert kl_sink < kl_bare  # measured: 0.05 vs 0.28 at the end, 0.06 vs 0.34 in the middle
    assert with_sink.strategies["splice"].tokens_computed == 0  # splicing runs no token through the model


def test_gemma3_270m_one_rope_base_is_wrong_and_per_layer_bases_are_right(data_dir):
    import dataclasses

    from worker.engine.rope import RopeLayout

    eng = load("gemma3-270m", device="cpu", data_dir=data_dir)
    types = {lr.layer_type for lr in eng.rope.layers}
    assert types == {"sliding_attention", "full_attention"}
    notes = eng.prefill(SHIPMENT)
    delta = 39
    cache = DynamicCache()
    pos = torch.arange(notes.n_tokens).unsqueeze(0) + delta
    with torch.inference_mode():
        eng.model(input_ids=torch.tensor([notes.token_ids]), position_ids=pos, cache=cache, use_cache=True)
    direct = [layer.keys for layer in cache.layers]
    glob = next(lr for lr in eng.rope.layers if lr.layer_type == "full_attention")
    one = dataclasses.replace(notes, rope=RopeLayout(tuple(glob for _ in eng.rope.layers)))

    def err(moved):
        return max(float((k - d).abs().max()) for (k, _), d in zip(moved.layers, direct))

    scale = max(float(d.abs().max()) for d in direct)
    right, wrong = err(notes.shifted(delta)), err(one.shifted(delta))
    assert right / scale <= 1e-4
    assert wrong > 1.0 and wrong / scale > 0.01  # FINDINGS measured key errors of 10-20
