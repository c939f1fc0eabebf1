"""Values generated for a sweep (`vocabulary.sweep_values`), pure: evenly spaced over a range with
both ends included, the same every time; lines sampled with a seed; and each bad input refused with
a message naming the problem."""

from __future__ import annotations

import pytest

from vocabulary.sweep_values import GenerateError, generate_values


def test_ranges_are_evenly_spaced_with_both_ends_and_lines_are_seeded() -> None:
    assert generate_values("integers", 5, "1", "10") == ["1", "3", "6", "8", "10"]
    assert generate_values("integers", 1, "4", "9") == ["4"]
    assert generate_values("decimals", 3, "0", "1", places=1) == ["0.0", "0.5", "1.0"]
    assert generate_values("dates", 3, "2026-01-01", "2026-01-31") == \
        ["2026-01-01", "2026-01-16", "2026-01-31"]
    assert generate_values("timestamps", 4, "2026-01-01T00:00", "2026-01-02T00:00") == [
        "2026-01-01 00:00", "2026-01-01 08:00", "2026-01-01 16:00", "2026-01-02 00:00"]
    assert generate_values("timestamps", 2, "2026-01-01T00:00:30", "2026-01-01T00:01:00") == [
        "2026-01-01 00:00:30", "2026-01-01 00:01:00"]  # seconds shown when the range has them
    assert len(generate_values("timestamps", 200, "2026-01-01T00:00", "2026-12-31T23:00")) == 200
    lines = ["Bergen", "Lyon", " ", "Porto", "Lyon", "Graz"]
    once = generate_values("lines", 3, lines=lines, seed=5)
    assert once == generate_values("lines", 3, lines=lines, seed=5) and len(set(once)) == 3
    assert set(generate_values("lines", 4, lines=lines)) == {"Bergen", "Lyon", "Porto", "Graz"}


@pytest.mark.parametrize("args, kwargs, message", [
    (("integers", 3, "5", "5"), {}, "the range is empty: start and end are both 5"),
    (("integers", 3, "9", "1"), {}, "the range is reversed: start 9 is after end 1"),
    (("dates", 2, "2026-03-01", "2026-02-01"), {}, "start 2026-03-01 is after end 2026-02-01"),
    (("integers", 20, "1", "5"), {}, "the range 1..5 holds 5 integers; 20 asked"),
    (("dates", 40, "2026-01-01", "2026-01-31"), {}, "holds 31 days; 40 asked"),
    (("integers", 300, "1", "1000"), {"limit": 200}, "300 values asked; a sweep takes at most 200 edits"),
    (("decimals", 5, "0", "0.01"), {"places": 2}, "too narrow at 2 decimal places"),
    (("timestamps", 3, "noon", "2026-01-01T12:00"), {}, "start 'noon' is not an ISO 8601 date-time"),
    (("integers", 3, "1.5", "4"), {}, "start '1.5' is not an integer"),
    (("integers", 3, None, "4"), {}, "integers need a start"),
    (("lines", 3), {"lines": ["a", "b"]}, "3 values asked from 2 distinct lines"),
    (("lines", 1), {"lines": [" "]}, "the list of lines is empty"),
    (("dates", 3, "2026-01-01", "2026-01-31"), {"fmt": "%Y"}, "gives the same text for different days"),
    (("dates", 3, "2026-01-01", "2026-01-31"), {"fmt": "%Y\ud800"}, "is not a strftime format"),
    (("weeks", 3, "1", "2"), {}, "unknown kind 'weeks'"),
    (("integers", 0, "1", "2"), {}, "count must be at least 1"),
])
def test_bad_input_names_the_problem(args, kwargs, message) -> None:
    with pytest.raises(GenerateError) as refused:
        generate_values(*args, **kwargs)
    assert message in str(refused.value)
