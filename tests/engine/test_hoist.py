"""`hoist`, the paper's hoist-to-end baseline: the notes before the field's line are the cached
ones, the tail (the moved line with its new value) is all an edit computes, and every metric is
measured against recompute of the edited document in its own layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vocabulary.hoist import hoist
from vocabulary.prefix import common_prefix
from worker.engine import Field, Question, RunRequest, load
from worker.engine.forward import extend
from worker.engine.run import _plan
from worker.engine.strategies import EDITS

DOC = ("Account record.\nstatus: active\nowner: Ada Lovelace\nregion: north\n"
       "Only active accounts may log in.\n")
QUESTION = Question("Can this user log in?", ("yes", "no"))


def _field(document: str, old: str, new: str) -> Field:
    start = document.index(old)
    return Field(start, start + len(old), new, "status")


def _hoisted_case(eng, document: str, field: Field):
    """The hoist strategy of a run, prepared, and the run's case."""
    request = RunRequest(document, QUESTION, fields=(field,), strategies=("recompute", "hoist"))
    case, _bench = _plan(eng, request, eng.prefill(document), lambda stage, fraction: None)
    strategy = EDITS.build(["hoist"])["hoist"]
    strategy.prepare(case)
    return strategy, case


@pytest.mark.parametrize("alias", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_the_notes_before_the_fields_line_are_recomputes_of_the_hoisted_layout_bit_for_bit(alias):
    eng = load(alias)
    field = _field(DOC, "active", "suspended")
    strategy, case = _hoisted_case(eng, DOC, field)
    surgery = strategy.surgery(case)
    new_ids = eng.tokenize_document(hoist(DOC, [field]).text)[0]
    assert surgery.token_ids == new_ids
    line = common_prefix(eng.prefill(DOC).token_ids, new_ids)  # the tokens before the field's line
    assert 0 < line < len(new_ids)
    recomputed = extend(eng.model, None, new_ids)
    for (k, v), (rk, rv) in zip(surgery.layers, recomputed):
        assert torch.equal(k[:, :, :line], rk[:, :, :line]) and torch.equal(v[:, :, :line], rv[:, :, :line])
    tail = eng.tokenize_document(hoist(DOC, [field]).text)[0][strategy.keep:]
    assert surgery.pending == tail and surgery.tokens_computed == len(tail) < len(new_ids) // 3


def test_hoist_reports_every_metric_against_recompute_of_the_edited_document():
    eng = load("tiny-llama")
    field = _field(DOC, "active", "suspended")
    report = eng.edit(DOC, [field], QUESTION, strategies=["recompute", "hoist"], attention=["hoist"])
    hoisted, recompute = report.strategies["hoist"], report.strategies["recompute"]
    strategy, case = _hoisted_case(eng, DOC, field)
    new_ids = eng.tokenize_document(hoist(DOC, [field]).text)[0]
    suffix = eng.encode(eng.frame.suffix(QUESTION))
    assert hoisted.tokens_computed == len(new_ids) - strategy.keep
    assert hoisted.prefix_cache_share == pytest.approx(strategy.keep / (len(new_ids) + len(suffix)), abs=1e-4)
    assert recompute.tokens_computed == len(eng.tokenize_document(DOC.replace("active", "suspended", 1))[0])
    assert set(hoisted.choice_probs) == {"yes", "no"} and hoisted.kl_to_recompute >= 0
    assert hoisted.picked is None and hoisted.edit_followed in ("new", "old", "both", "neither")
    tokens = report.attention["hoist"].tokens
    moved = [t for t in tokens if t.segment == "document" and t.start >= field.start and t.end <= field.end]
    assert moved and tokens.index(moved[0]) > len(tokens) // 2  # in the tail, mapped back to the field


@pytest.mark.slow
def test_kvnotes_edit_hoists_a_field_at_the_top_of_a_document_for_under_a_fifth_of_recomputes_tokens(
        tmp_path, data_dir):
    lines = [f"2026-03-{1 + i % 28:02d} The dispatcher logged pallet {100 + i} after a short delay."
             for i in range(12)]
    document = tmp_path / "doc.txt"
    document.write_text("destination: Oslo\n" + "\n".join(lines) + "\n")
    env = {**os.environ, "KVNOTES_DATA": str(data_dir)}
    out = subprocess.run(
        [sys.executable, "-m", "commands.cli", "edit", "--model", "smollm2-135m", "--device", "cpu",
         "--document", str(document), "--replace", "Oslo", "Madrid",
         "--question", "What is the destination of this shipment?", "--choices", "Oslo,Madrid",
         "--strategies", "recompute,hoist", "--json"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["strategies"]
    hoisted, recompute = data["hoist"]["tokens_computed"], data["recompute"]["tokens_computed"]
    assert 0 < hoisted < 0.2 * recompute, (hoisted, recompute)
    assert data["hoist"]["prefix_cache_share"] > 0.8 > data["recompute"]["prefix_cache_share"]
