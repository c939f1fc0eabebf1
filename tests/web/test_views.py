"""The numbers the pages draw, computed directly: the document's pieces and RoPE shifts, the token
alignment between two caches, and how far a head's attention moved from recompute's."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from app.web.notebooks.document_view import build_document_view, document_tokens_before, paragraph_starts
from app.web.runs.view import align_tokens, head_differences
from data.contracts import TokenRecord

DOC = "Record\n\nstatus: active\n\nOnly active may log in."


def tok(text: str, start: int = -1, segment: str = "document") -> TokenRecord:
    end = start + len(text) if start >= 0 else -1
    return TokenRecord(id=hash(text) % 1000, text=text, start=start, end=end, segment=segment)


TOKENS = [tok("<s>", segment="frame"), tok("Record", 0), tok("status", 8), tok(":", 14), tok(" active", 15),
          tok("Only", 24)]


def test_document_view_pieces_offsets_and_exact_rope_shifts():
    field = NS(id=1, start=16, end=22, old_value="active", new_value="closed", label="status")
    skill = NS(id=7, name="s", text="x", token_count=3)
    inside_field = NS(id=2, position=18, skill=skill)  # drawn right after the field it falls in
    at_end = NS(id=3, position=None, skill=skill)
    view = build_document_view(DOC, [field], [inside_field, at_end], TOKENS)
    assert [(p.kind, p.start, p.end) for p in view.pieces] == [
        ("text", 0, 8), ("dropzone", 8, 8), ("text", 8, 16), ("field", 16, 22), ("placement", 22, 22),
        ("text", 22, 24), ("dropzone", 24, 24), ("text", 24, 47), ("placement", 47, 47), ("dropzone", 47, 47),
    ]
    assert "".join(p.text for p in view.pieces) == DOC  # every character drawn exactly once
    placed = [p for p in view.pieces if p.kind == "placement"]
    # 1 frame token + the 4 document tokens ending at or before 22; then + "Only" at the end
    assert [(p.shift, p.shift_exact, p.at_end) for p in placed] == [(5, True, False), (6, True, True)]


def test_without_tokens_a_shift_is_four_characters_a_token():
    view = build_document_view(DOC, [], [NS(id=1, position=24, skill=None)])
    placed = next(p for p in view.pieces if p.kind == "placement")
    assert (placed.shift, placed.shift_exact) == (6, False)  # ceil(24 / 4)
    assert paragraph_starts(DOC) == [8, 24]
    assert document_tokens_before(24, None) is None


def test_alignment_skips_what_recompute_does_not_have():
    reference = [tok("<s>", segment="frame"), tok("a", 0), tok("b", 1), tok("Q", segment="question")]
    erratum = [*reference[:3], tok(" [STATE", segment="erratum"),
               tok(" UPDATE]", segment="erratum"), reference[3]]
    assert align_tokens(erratum, reference) == [0, 1, 2, -1, -1, 3]
    changed = [reference[0], tok("a", 0), tok("x", 1), reference[3]]  # a changed field's token
    assert align_tokens(changed, reference) == [0, 1, -1, 3]


def test_head_difference_is_total_variation_over_aligned_tokens():
    weights = np.array([[[0.5, 0.3, 0.2]]])
    reference = np.array([[[0.5, 0.2, 0.3]]])
    assert head_differences(weights, reference, [0, 1, 2])[0, 0] == pytest.approx(0.1)
    # mass on a token recompute lacks (index 1) counts fully: (|0.4-0.6| + 0.4 + |0.2-0.4|) / 2
    weights = np.array([[[0.4, 0.4, 0.2]]])
    reference = np.array([[[0.6, 0.4]]])
    assert head_differences(weights, reference, [0, -1, 1])[0, 0] == pytest.approx(0.4)
    # recompute's mass on a token the strategy lacks (index 1) counts too: (0.3 + 0 + 0.3) / 2
    weights = np.array([[[0.7, 0.3]]])
    reference = np.array([[[0.4, 0.3, 0.3]]])
    assert head_differences(weights, reference, [0, 2])[0, 0] == pytest.approx(0.3)
    same = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, 3))
    assert np.allclose(head_differences(same, same, list(range(5))), 0)


def test_most_attended_lines_sum_attention_over_their_tokens() -> None:
    from app.web.runs.top_lines import lines_by_default, top_lines, units

    texts = ["<s>", "A", "B", "C", "Account", " record", "\n", "The", " status", " is", " active", ".",
             " Only", " the", " owner", " logs", " in", ".", "\n", "What"]
    segs = ["frame"] + ["document"] * 18 + ["question"]
    tokens = [TokenRecord(id=i, text=t, start=i, end=i + 1, segment=s)
              for i, (t, s) in enumerate(zip(texts, segs))]
    assert ["".join(texts[a:b]) for a, b in units(tokens)] == [
        "Account record", "The status is active.", " Only the owner logs in."]  # the sink left out
    sv = np.arange(len(texts), dtype=np.float32) / 100
    rv = sv[::-1].copy()
    mapping = list(range(len(texts)))
    lines = top_lines(tokens, rv, sv, mapping, n=3)
    expected = ["Only the owner logs in.", "The status is active.", "Account record"]
    assert [line.text for line in lines] == expected
    only = lines[0]
    assert only.strategy == pytest.approx(float(sv[12:18].sum())) and only.tokens == 6
    assert only.recompute == pytest.approx(float(rv[12:18].sum()))
    assert lines_by_default([" the", " of", " the", "The"]) and not lines_by_default([" the", " status"])


def test_snippets_start_and_end_on_word_boundaries() -> None:
    from app.web.templating import word_head, word_tail

    before = "Before answering, check account_status in the session conte"  # "conte" meets the token
    assert word_tail(before, 24) == "… in the session conte"  # was "ount_status in the session conte"
    assert word_head("xt before you answer the customer", 16) == "xt before you…"
    assert word_head("short", 16) == "short" and word_tail("short", 16) == "short"
