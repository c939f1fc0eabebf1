"""Character offsets across a run's texts (`worker.engine.offsets`), with exact numbers."""

from __future__ import annotations

from worker.engine.offsets import NO_SPAN, Insertions, apply_fields, new_to_document
from worker.engine.types import Field

DOC = "status: active\nregion: north\n"  # "active" at 8..14, "north" at 23..28


def test_a_skill_inserted_at_a_char_moves_what_starts_there_but_not_what_ends_there():
    inserts = Insertions.of([(15, 5)])  # a 5-character skill before "region"
    assert [inserts.to_composed(c) for c in (0, 14, 15, 23)] == [0, 14, 20, 28]
    assert inserts.to_composed(15, is_end=True) == 15
    assert [inserts.from_composed(c) for c in (14, 15, 19, 20, 28)] == [14, -1, -1, 15, 23]
    moved = inserts.move(Field(23, 28, "south", "region"))
    assert (moved.start, moved.end) == (28, 33)


def test_applying_fields_replaces_each_span_once():
    fields = [Field(8, 14, "closed", "status"), Field(23, 28, "south-east", "region")]
    assert apply_fields(DOC, fields) == "status: closed\nregion: south-east\n"


def test_new_tokens_map_back_to_the_old_document():
    fields = [Field(8, 14, "on hold", "status"), Field(23, 28, "south", "region")]  # +1 char, same length
    none = Insertions()
    new = apply_fields(DOC, fields)  # "status: on hold\nregion: south\n"
    assert new_to_document((0, 6), fields, none) == (0, 6)  # before any field: unchanged
    assert new_to_document((8, 10), fields, none) == (8, 14)  # inside a new value: its whole field
    assert new_to_document((12, 15), fields, none) == (8, 14)
    assert new[16:22] == "region" and new_to_document((16, 22), fields, none) == (15, 21)  # shifted back by 1
    assert new_to_document((24, 29), fields, none) == (23, 28)
    assert new_to_document(NO_SPAN, fields, none) == NO_SPAN
    with_skill = Insertions.of([(15, 4)])  # "Hi. " before "region"
    assert new_to_document((16, 20), fields, with_skill) == NO_SPAN  # the skill's own text
    assert new_to_document((20, 26), fields, with_skill) == (15, 21)
