"""The notes map on a real (tiny) model: spans cut on word boundaries, and with several fields each
field's own share, measured by refreshing that field alone."""

from __future__ import annotations

from difflib import SequenceMatcher

import pytest

from worker.engine import Field, Question, load
from worker.engine.attribution import _changed_stretches, _only, attribute, word_spans
from worker.engine.edit import Editor
from worker.engine.offsets import Insertions, new_to_document

# timestamps like "09:09" are where a fixed token count cut mid-word (":09 Operations")
TEXT = ("Account record. status: active. owner: Ada Lovelace. region: north. "
        + "".join(f"2026-03-{d:02d} 09:{d:02d} Operations desk logged entry {d}. " for d in range(1, 5)))
QUESTION = Question("Can this user log in?", ("yes", "no"))


def _on_boundary(text: str, at: int) -> bool:
    return at in (0, len(text)) or text[at - 1].isspace() or text[at].isspace()


def test_spans_start_and_end_on_word_boundaries() -> None:
    eng = load("tiny-llama")  # byte tokens: a fixed count of them cuts words anywhere
    at = TEXT.index("active")
    result = attribute(eng, TEXT, [Field(at, at + 6, "closed", "status")], QUESTION, span_tokens=5, coarse=1)
    spans = [s for s in result.spans if s.start_char >= 0]
    assert len(spans) > 20
    edges = (at, at + 6)  # the field is a region of its own: "active." is cut after "active"
    bad = [TEXT[s.start_char:s.end_char] for s in spans
           if not all(_on_boundary(TEXT, c) or c in edges for c in (s.start_char, s.end_char))]
    assert bad == []
    assert [TEXT[s.start_char:s.end_char] for s in spans if s.start_char == at] == ["active"]
    assert all(a.end == b.start for a, b in zip(result.spans, result.spans[1:]))  # they still tile the notes
    assert max(s.end - s.start for s in result.spans) <= 5 + 6  # ~5 tokens; a cut moves by part of a word


def test_word_spans_move_each_cut_to_the_nearest_word_start() -> None:
    starts = [True, False, False, True, False, False, False, False, True, False]
    assert word_spans(starts, 0, 10, 4) == [(0, 3), (3, 8), (8, 10)]
    assert word_spans([True] + [False] * 9, 0, 10, 3) == [(0, 10)]  # no word start: one span


def test_each_field_refreshed_alone_has_its_own_share() -> None:
    eng = load("tiny-llama")
    status, region = TEXT.index("active"), TEXT.index("north")
    fields = [Field(status, status + 6, "permanently closed", "status"),
              Field(region, region + 5, "south", "region")]
    both = attribute(eng, TEXT, fields, QUESTION, span_tokens=16)
    assert [(e.start_char, e.end_char) for e in both.edits] == [(status, status + 6), (region, region + 5)]
    for e in both.edits:
        assert e.share == pytest.approx((both.kl_stale - e.kl_after) / both.kl_stale)
    # the status field alone: exactly the tokens of the document with only that field changed
    old = eng.prefill(TEXT)
    new_text = TEXT[:region] + "south" + TEXT[region + 5:]
    new_text = new_text[:status] + "permanently closed" + new_text[status + 6:]
    ids, offsets, segments = eng.tokenize_document(new_text)
    offsets = [new_to_document(o, fields, Insertions()) for o in offsets]
    editor = Editor(eng.model, eng.rope, old, ids, segments, offsets)
    ops = SequenceMatcher(a=old.token_ids, b=ids, autojunk=False).get_opcodes()
    groups = _changed_stretches(editor, ops)
    assert len(groups) == 2
    alone = _only(editor, ops, groups[0][2])
    only_status = TEXT[:status] + "permanently closed" + TEXT[status + 6:]
    assert alone.new_ids == eng.tokenize_document(only_status)[0]
    # one field: its own share is the field's share
    one = attribute(eng, TEXT, fields[:1], QUESTION, span_tokens=16)
    assert len(one.edits) == 1 and one.edits[0].share == pytest.approx(one.field_share)
    assert both.edits[1].share != pytest.approx(both.field_share)  # region alone is not both together

