"""One batched greedy decode for every strategy of a decision-only run (issue 42, item 1): the rows'
caches differ in length (padded, masked), yet each row's answer is token for token the one its
strategy's own readout generates, on both bundled models (gemma3-270m's sliding-window layers
included: the notes are longer than its 512-token window), in float32 and in bfloat16; and N answer
tokens cost N − 1 batched decode steps after the prompts, whatever the number of strategies."""

from __future__ import annotations

import pytest
import torch

from worker.engine import Question, load
from worker.engine.batched import Row
from worker.engine.decode import answer_all
from worker.engine.edit import Editor
from worker.engine.notes import cache_from_layers
from worker.engine.readout import decide
from worker.engine.strategies.edits.in_place import in_place

pytestmark = pytest.mark.slow

LOG = " ".join(f"Entry {i}: pallet {i * 7 % 31} moved to bay {i % 9}, checked by the night crew."
               for i in range(36))
DOC = ("Shipment record.\ncustomer: Halvorsen Marine\ndestination: Oslo\ncarrier: NordFreight\n"
       + LOG + "\nEnd of record.\n")
QUESTION = Question("Where is this shipment going? Answer with the city.", (), max_new_tokens=6)


def _rows(eng, notes, value: str) -> list[Row]:
    """The readouts of a decision-only edit: the reference, the old notes, in_place (deferring where
    the model allows), an erratum after the old notes and after the reference: four lengths."""
    start = DOC.index("Oslo")
    new_ids, segments, offsets = eng.tokenize_document(DOC[:start] + value + DOC[start + 4:])
    editor = Editor(eng.model, eng.rope, notes, new_ids, segments, offsets)
    erratum = tuple(eng.encode(f"\n[CORRECTION] destination is now {value}.\n"))
    reference, moved = editor.from_first_change(), in_place(editor, defer=True)
    return [Row(reference.layers), Row(notes.layers), Row(moved.layers, (), moved.deferred),
            Row(notes.layers, erratum), Row(reference.layers, erratum)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_every_row_decodes_the_tokens_its_own_readout_decodes(alias, dtype, data_dir):
    eng = load(alias, device="cpu", dtype=dtype, data_dir=data_dir)
    notes = eng.prefill(DOC)
    if alias == "gemma3-270m":
        assert len(notes.token_ids) > eng.model.config.get_text_config().sliding_window
    suffix = eng.encode(eng.frame.suffix(QUESTION))
    for value in ("Madrid", "Riga"):
        rows = _rows(eng, notes, value)
        steps: list[tuple[int, int]] = []
        hook = eng.model.register_forward_pre_hook(
            lambda module, args, kwargs, seen=steps: seen.append(tuple(kwargs["input_ids"].shape)),
            with_kwargs=True)
        try:
            together = answer_all(eng.model, eng.tokenizer, eng.frame, rows, suffix, QUESTION)
        finally:
            hook.remove()
        for row, got in zip(rows, together):
            base = [(k.clone(), v.clone()) for k, v in row.base] if row.deferred else row.base
            alone = decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(base, eng.model), suffix,
                           QUESTION, pending=list(row.shared), deferred=row.deferred)
            assert got.answer_ids == alone.answer_ids, (alias, dtype, value)
            assert got.decision == alone.decision and got.text == alone.text
            assert torch.allclose(got.logits, alone.logits, atol=1e-3 if dtype == "float32" else 0.5)
        # one batched step per answer token after the first (the prompts' forwards come first)
        batched = [shape for shape in steps if shape == (len(rows), 1)]
        longest = max(len(got.answer_ids) for got in together)
        assert len(batched) <= QUESTION.max_new_tokens - 1 and len(batched) >= min(longest, 5) - 1


@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_a_draft_changes_no_token_and_a_right_one_takes_no_step(alias, data_dir):
    """Speculative decoding from a draft of the answer (a sweep's edit before): with the right answer
    and its stop token, the answer alone, its first token wrong, half of it right and a long draft
    of noise, every row answers what its own readout answers; the right draft ends every row in the
    prompt forward (0 decode steps), a draft wrong from its first token takes the steps no draft takes."""
    eng = load(alias, device="cpu", data_dir=data_dir)
    notes = eng.prefill(DOC)
    suffix = eng.encode(eng.frame.suffix(QUESTION))
    rows = [row for row in _rows(eng, notes, "Madrid") if row.deferred is None]
    alone = [decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(row.base, eng.model), suffix,
                    QUESTION, pending=list(row.shared)) for row in rows]

    def answered(drafts):
        steps: list[tuple[int, int]] = []
        hook = eng.model.register_forward_pre_hook(
            lambda module, args, kwargs: steps.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        try:
            got = answer_all(eng.model, eng.tokenizer, eng.frame, rows, suffix, QUESTION, drafts)
        finally:
            hook.remove()
        return got, [shape for shape in steps if shape[1] == 1]

    plain, plain_steps = answered(())
    assert [got.answer_ids for got in plain] == [a.answer_ids for a in alone]
    assert len(plain_steps) >= 1  # the answers here are longer than one token
    ends = [got.answer_end for got in plain]
    noise = [t for t in eng.encode(" lorem ipsum dolor sit amet consectetur adipiscing elit sed do")
             if all(t != a.answer_ids[0] for a in alone)]
    guesses = {
        "right": [a.answer_ids + ([end] if end is not None else []) for a, end in zip(alone, ends)],
        "tokens only": [a.answer_ids for a in alone],
        "first wrong": [noise[:1] + a.answer_ids[1:] for a in alone],
        "half": [a.answer_ids[:len(a.answer_ids) // 2] + noise[:3] for a in alone],
        "noise": [noise for _ in alone],
    }
    for name, drafts in guesses.items():
        got, steps = answered(drafts)
        assert [g.answer_ids for g in got] == [a.answer_ids for a in alone], (alias, name)
        assert [g.decision for g in got] == [a.decision for a in alone], (alias, name)
        for g, a in zip(got, alone):
            assert torch.allclose(g.logits, a.logits, atol=1e-3), (alias, name)
        if name == "right":
            assert steps == [] and all(g.drafted > len(a.answer_ids) or g.answer_end is None
                                       for g, a in zip(got, alone))
        if name in ("first wrong", "noise"):
            assert len(steps) == len(plain_steps) and all(g.drafted == 0 for g in got)
