"""A decision-only run's readouts in batched forwards (`worker.engine.batched`): each batch row reads
what its strategy reads alone (its own notes, appended and deferred tokens, every order of the
choices), and a decision-only run of every sweep strategy makes one forward for its reference and
batched forwards for its readouts, where it made one per strategy (and one to rank selective's
tokens) before; the cached notes' own readout (stale's) is read once for a sweep's edits."""

from __future__ import annotations

import pytest
import torch

from vocabulary.sweeps import SWEEP_STRATEGIES
from worker.engine import Field, Question, RunRequest, load
from worker.engine.batched import Row, batches, rows_forward
from worker.engine.edit import Editor
from worker.engine.forward import cut
from worker.engine.orders import orders_forward
from worker.engine.readout import _choice_ids, orders_suffixes
from worker.engine.strategies.edits.in_place import in_place
from worker.engine.strategies.edits.selective import selective

DOC = ("Shipment record.\ncustomer: Halvorsen Marine\ndestination: Oslo\ncarrier: NordFreight\n"
       "Operations log: the pallets were counted, the invoice was archived, the driver called twice, "
       "the customs papers were stamped and the crane was booked for the morning shift.\n")
QUESTION = Question("What is the destination?", ("Oslo", "Madrid", "Riga"))


def test_every_batch_row_reads_what_its_readout_reads_alone():
    eng = load("tiny-llama")
    notes = eng.prefill(DOC)
    start = DOC.index("Oslo")
    new_ids, segs, offs = eng.tokenize_document(DOC[:start] + "Madrid" + DOC[start + 4:])
    editor = Editor(eng.model, eng.rope, notes, new_ids, segs, offs)
    erratum = tuple(eng.encode("\n[CORRECTION] destination is now Madrid.\n"))
    moved, chosen = in_place(editor, defer=True), selective(editor, 0.3, defer=True)
    assert moved.deferred is not None and len(chosen.deferred.positions) > len(moved.deferred.positions)
    rows = [Row(notes.layers), Row(notes.layers, erratum), Row(moved.layers, (), moved.deferred),
            Row(chosen.layers, erratum, chosen.deferred), Row(cut(notes.layers, 0, 20), erratum)]
    suffixes = [eng.encode(eng.frame.suffix(QUESTION)), *orders_suffixes(eng.tokenizer, eng.frame, QUESTION)]
    encoded = _choice_ids(eng.tokenizer, eng.frame, QUESTION.choices)
    together = rows_forward(eng.model, rows, suffixes, encoded)
    assert len(together) == 5 and len(together[0].heads) == 6  # three choices: six orders
    for row, got in zip(rows, together):
        heads, scores, cache = orders_forward(eng.model, row.base, list(row.shared), suffixes, encoded,
                                              row.deferred)
        for a, b in zip(heads, got.heads):
            assert torch.allclose(a, b, atol=1e-4)
        flat = [s for order in scores for s in order]
        assert [s for order in got.scores for s in order] == pytest.approx(flat, abs=1e-4)
        if row.deferred is None:
            assert got.deferred_kv is None
            continue
        n = len(row.deferred.positions)
        for layer, (k, v) in zip(cache.layers, got.deferred_kv):
            assert k.shape == layer.tail_keys[:, :, :n].shape
            assert torch.allclose(k, layer.tail_keys[:, :, :n], atol=1e-5)
            assert torch.allclose(v, layer.tail_values[:, :, :n], atol=1e-5)


def test_rows_of_similar_length_share_a_forward_and_a_long_one_goes_alone():
    assert batches([60, 61, 86, 87, 62]) == [[0, 1, 4, 2, 3]]
    assert batches([60, 61, 86, 87, 62, 900]) == [[0, 1, 4, 2, 3], [5]]
    assert batches([60, 900], fixed=10_000) == [[0, 1]]  # a forward dearer than any padding
    assert batches([]) == []


def _forwards(eng, request, notes) -> tuple[list[tuple[int, int]], object]:
    """(batch, length) of every forward `request` makes, and its report."""
    seen: list[tuple[int, int]] = []
    hook = eng.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        report = eng.run(request, notes=notes)
    finally:
        hook.remove()
    return seen, report


def _second_chunks(report, with_stale: bool = False) -> int:
    """The readouts of a decision-only `report` that read past the first chunk of orders."""
    shared = set(report.read_from) | (set() if with_stale else {"stale"})
    return sum(n > 4 for name, n in report.orders_read.items() if name not in shared)


def test_a_decision_only_edit_of_every_sweep_strategy_makes_a_reference_and_batched_readouts():
    eng = load("tiny-llama")
    eng.warm_up()
    notes = eng.prefill(DOC)
    start = DOC.index("Oslo")
    runs = {}
    for value in ("Madrid", "Riga"):
        request = RunRequest(DOC, QUESTION, fields=(Field(start, start + 4, value, "destination"),),
                             strategies=tuple(SWEEP_STRATEGIES), timing=False)
        runs[value] = _forwards(eng, request, notes)
    new_ids = eng.tokenize_document(DOC.replace("Oslo", "Riga"))[0]
    first_change = next(i for i, (a, b) in enumerate(zip(notes.token_ids, new_ids)) if a != b)
    (first, _), (second, report) = runs["Madrid"], runs["Riga"]
    # the first edit also lays out hoist's document once (kept with the notes for the next edits)
    assert first[0][0] == 1 and first[0][1] > 100
    assert sum(b for b, _ in first[2:]) == 7 + _second_chunks(runs["Madrid"][1], with_stale=True)
    # the reference from the field on, then batched forwards: a row per distinct readout (recompute
    # and prefix_reuse share theirs; stale's was read with the first edit), at most two groups
    # (selective's deferred tokens make its row far longer than the others on this tiny tokenizer),
    # each reading the first 4 of the 6 orders, then the last 2 for the rows not settled by then
    assert second[0] == (1, len(new_ids) - first_change)
    assert sum(b for b, _ in second[1:]) == 6 + _second_chunks(report) and len(second) <= 5
    assert report.read_from == {"prefix_reuse": "recompute"}
    assert "read off recompute's readout" in report.strategies["prefix_reuse"].detail
    assert set(report.strategies) == set(SWEEP_STRATEGIES)
    assert report.strategies["stale"].decision == runs["Madrid"][1].strategies["stale"].decision
