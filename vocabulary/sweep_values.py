"""Values for a sweep without typing them: N values of a field generated as timestamps over a range,
integers or decimals in a range, dates, or lines sampled (seeded) from a list. Pure stdlib: the API,
the notebook's Sweep panel and `kvnotes sweep --generate` all call `generate_values`.

Ranges are inclusive and the values evenly spaced across them, first and last included (one value:
the start), so the same request always gives the same values; lines are sampled without
replacement with `random.Random(seed)`. Bad input is a `GenerateError` naming the problem: an empty
range (start equals end) or a reversed one, more values than the range holds distinct (or than
`limit`), a start or end that does not parse, an empty list of lines.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Literal

Kind = Literal["timestamps", "integers", "decimals", "dates", "lines"]
KINDS: tuple[Kind, ...] = ("timestamps", "integers", "decimals", "dates", "lines")
KIND_HELP = {
    "timestamps": "date-times evenly spaced from start to end (ISO 8601, e.g. 2026-01-05T09:00)",
    "integers": "whole numbers evenly spaced from start to end",
    "decimals": "numbers with `places` decimals evenly spaced from start to end",
    "dates": "days evenly spaced from start to end (ISO 8601, e.g. 2026-01-05)",
    "lines": "lines sampled without replacement from a list (seeded)",
}


_EXPECTED = {"integers": "an integer (e.g. 42)", "decimals": "a number (e.g. 3.5)",
             "dates": "an ISO 8601 date (e.g. 2026-01-05)",
             "timestamps": "an ISO 8601 date-time (e.g. 2026-01-05T09:00)"}


class GenerateError(ValueError):
    """Generated values cannot be made as asked; the message names the problem."""


def _spaced(count: int, i: int) -> float:
    """Where the i-th of `count` evenly spaced values lies between start (0) and end (1)."""
    return 0.0 if count == 1 else i / (count - 1)


def _ordered(start, end, shown: tuple[str, str]) -> None:
    if start == end:
        raise GenerateError(f"the range is empty: start and end are both {shown[0]}")
    if start > end:
        raise GenerateError(f"the range is reversed: start {shown[0]} is after end {shown[1]}")


def _parse(kind: Kind, text: str | None, what: str):
    if text is None or not str(text).strip():
        raise GenerateError(f"{kind} need a {what}")
    text = str(text).strip()
    try:
        if kind == "integers":
            return int(text)
        if kind == "decimals":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if kind == "dates":
            return date.fromisoformat(text)
        return datetime.fromisoformat(text)
    except ValueError:
        raise GenerateError(f"{what} {text!r} is not {_EXPECTED[kind]}") from None


def _distinct(values: list[str], count: int, why: str) -> list[str]:
    if len(set(values)) < count:
        raise GenerateError(f"{count} distinct values do not fit: {why}")
    return values


def generate_values(kind: str, count: int, start: str | None = None, end: str | None = None, *,
                    places: int = 2, lines: Sequence[str] | None = None, seed: int = 0,
                    fmt: str | None = None, limit: int | None = None) -> list[str]:
    """`count` values of `kind` (see the module's docstring); `limit`: the most a sweep takes."""
    if kind not in KINDS:
        raise GenerateError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
    if count < 1:
        raise GenerateError(f"count must be at least 1; got {count}")
    if limit is not None and count > limit:
        raise GenerateError(f"{count} values asked; a sweep takes at most {limit} edits "
                            "(KVNOTES_MAX_SWEEP_EDITS)")
    if kind == "lines":
        pool = list(dict.fromkeys(line.strip() for line in (lines or ()) if line.strip()))
        if not pool:
            raise GenerateError("the list of lines is empty: upload or give one value a line")
        if count > len(pool):
            raise GenerateError(f"{count} values asked from {len(pool)} distinct lines: ask for at most "
                                f"{len(pool)}")
        return random.Random(seed).sample(pool, count)
    lo, hi = _parse(kind, start, "start"), _parse(kind, end, "end")
    _ordered(lo, hi, (str(start).strip(), str(end).strip()))
    if kind == "integers":
        span = hi - lo + 1
        if count > span:
            raise GenerateError(f"the range {lo}..{hi} holds {span} integers; {count} asked")
        return [str(math.floor(lo + _spaced(count, i) * (hi - lo) + 0.5)) for i in range(count)]
    if kind == "decimals":
        if not 0 <= places <= 12:
            raise GenerateError(f"places must be between 0 and 12; got {places}")
        values = [f"{lo + _spaced(count, i) * (hi - lo):.{places}f}" for i in range(count)]
        return _distinct(values, count, f"the range {lo}..{hi} is too narrow at {places} decimal places")
    if kind == "dates":
        days = (hi - lo).days
        if count > days + 1:
            raise GenerateError(f"the range {lo}..{hi} holds {days + 1} days; {count} asked")
        picked = [lo + timedelta(days=round(_spaced(count, i) * days)) for i in range(count)]
        return _distinct(_formatted(picked, fmt or "%Y-%m-%d"), count,
                         f"the format {fmt!r} gives the same text for different days")
    seconds = (hi - lo).total_seconds()
    default = "%Y-%m-%d %H:%M" if lo.second == hi.second == 0 else "%Y-%m-%d %H:%M:%S"
    stamps = [lo + timedelta(seconds=_spaced(count, i) * seconds) for i in range(count)]
    fmt = fmt or default
    return _distinct(_formatted(stamps, fmt), count, f"the range {start}..{end} is too short for the "
                                                     f"format {fmt!r}")


def _formatted(moments: Sequence[date], fmt: str) -> list[str]:
    try:
        return [m.strftime(fmt) for m in moments]
    except (ValueError, UnicodeError):
        raise GenerateError(f"the format {fmt!r} is not a strftime format") from None
