"""prefix_reuse is exact wherever the field sits: one forward after the reused prefix (split
attention: cached keys unmasked, the new block causally) gives recompute's decision distribution
(KL ≤ 1e-6) and runs only the tokens from the first change on, on the bundled model."""

from __future__ import annotations

import pytest

from worker.engine import Field, Question, load

pytestmark = pytest.mark.slow

LINES = [f"2026-03-{1 + i % 28:02d} The dispatcher logged pallet {100 + i} after a short delay."
         for i in range(40)]
QUESTION = Question("What is the destination of this shipment?", ("Oslo", "Madrid"))


@pytest.fixture(scope="module")
def smollm2(data_dir):
    return load("smollm2-135m", device="cpu", data_dir=data_dir)


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_prefix_reuse_is_exact_with_the_field_anywhere(smollm2, share):
    lines = list(LINES)
    lines.insert(int(share * len(lines)), "destination: Oslo")
    document = "SHIPMENT RECORD\n" + "\n".join(lines) + "\n"
    start = document.index("Oslo")
    report = smollm2.edit(document, [Field(start, start + 4, "Madrid", "destination")], QUESTION,
                          strategies=["recompute", "prefix_reuse"])
    reuse, full = report.strategies["prefix_reuse"], report.strategies["recompute"]
    assert reuse.kl_to_recompute <= 1e-6
    assert reuse.decision == full.decision and reuse.topk_overlap == 10
    changed_from = smollm2.tokenize_document(document[:start])[0]
    assert reuse.tokens_computed <= full.tokens_computed - len(changed_from) + 2  # only from the field on
