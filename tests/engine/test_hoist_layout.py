"""The hoist-to-end text transform (`vocabulary/hoist.py`): which lines move, and where the tail starts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from vocabulary.hoist import hoist, hoisted


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    new_value: str


DOC = "status: active\nname: Bob\nage: 3\n"


def _field(document: str, text: str, new: str) -> Span:
    start = document.index(text)
    return Span(start, start + len(text), new)


def test_the_fields_line_moves_after_the_document_with_its_new_value():
    h = hoist(DOC, [_field(DOC, "active", "suspended")])
    assert h.text == "name: Bob\nage: 3\nstatus: suspended\n"
    assert h.tail == "status: suspended\n" and h.tail_start == 17
    assert h.prefix_end == 0 and h.moved == ((0, 15),)
    assert (hoist(DOC, [_field(DOC, "active", "x")], values="old").text
            == "name: Bob\nage: 3\nstatus: active\n")


def test_several_fields_move_in_document_order_and_the_prefix_before_them_is_kept():
    h = hoist(DOC, [_field(DOC, "3", "4"), _field(DOC, "Bob", "Ann")])
    assert h.text == "status: active\nname: Ann\nage: 4\n"
    assert h.prefix_end == 15 and h.text[:15] == DOC[:15]


def test_a_field_on_the_last_line_stays_and_a_missing_final_newline_is_supplied():
    assert hoisted("a\nb: 1", [Span(5, 6, "2")]) == "a\nb: 2"
    assert hoisted("b: 1\nz", [Span(3, 4, "2")]) == "z\nb: 2\n"
    assert hoisted(DOC, []) == DOC


def test_overlapping_or_out_of_range_fields_are_refused_by_name():
    with pytest.raises(ValueError, match="overlap"):
        hoist(DOC, [Span(0, 5, "a"), Span(3, 8, "b")])
    with pytest.raises(ValueError, match="outside the document"):
        hoist(DOC, [Span(30, 40, "a")])


def test_every_hoisted_character_maps_back_to_where_it_came_from():
    h = hoist(DOC, [_field(DOC, "active", "suspended")])
    tail = h.tail_start
    assert h.source(0, 4) == (15, 19)  # "name" of the kept body
    assert h.source(tail, tail + 6) == (0, 6)  # "status" of the moved line
    assert h.source(tail + 8, tail + 9) == (8, 14)  # inside the new value: the whole field
