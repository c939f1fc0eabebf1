"""The one set of rules every text that comes in must pass, whatever carries it (a JSON body, a form
or a CSV or JSONL upload, a sign-in): valid Unicode (no lone surrogate such as U+D800, which no
UTF-8 page or JSON answer can carry), no NUL (PostgreSQL cannot store it), not blank, and at most a
length. The web's request types (`app.schema_types`) are built from these functions; nothing else
defines them.

"Blank" is what shows nothing: whitespace, format characters (zero-width space, BOM, joiners),
marks alone (a lone combining accent, a variation selector), controls, and the letters that show
nothing though Unicode calls them letters or symbols (the Hangul fillers, the blank Braille pattern).

A row written before these rules held may still hold a lone surrogate (only a JSON column can:
SQLite's text refuses one). `loads` reads stored JSON with every lone surrogate shown as U+FFFD
(`mend`), so such a row renders with its id on every page, answer and export instead of failing
them all; `unrenderable` says where one sits.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from typing import Any

# Characters that show nothing though Unicode gives them a letter's or symbol's category: the Hangul
# fillers (U+115F, 1160, 3164, FFA0) and the blank Braille pattern (U+2800).
BLANK_LETTERS = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800})
# Marks (combining accents, variation selectors such as FE0F and E0100, the combining grapheme
# joiner 034F) and format characters (zero-width space, BOM, …) show nothing alone.
SHOWS_NOTHING = frozenset({"Cf", "Mn", "Me", "Mc", "Cc", "Zl", "Zp", "Zs"})  # not unassigned (Cn): a
# pattern listing every unassigned code point is too large for schema tools to honour
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # how JSON writes one: \ud800


def invisible(ch: str) -> bool:
    """Does the character `ch` show nothing alone?"""
    return ch.isspace() or ord(ch) in BLANK_LETTERS or unicodedata.category(ch) in SHOWS_NOTHING


def visible(value: str) -> bool:
    """Has `value` a character that shows: not whitespace, a format character, a mark (a lone
    combining accent, a variation selector), a control, nor a blank letter?"""
    return not all(invisible(ch) for ch in value)


def lone_surrogate(value: str) -> int | None:
    """The index of the first lone surrogate in `value` (text that is not valid Unicode), or None."""
    found = _SURROGATE.search(value)
    return None if found is None else found.start()


def invisible_class() -> str:
    """A regex character class body of every character `visible` does not count, and NUL (the
    schema's statement of the blank rule)."""
    codes = [c for c in range(sys.maxunicode + 1)
             if c == 0 or (not 0xD800 <= c <= 0xDFFF and invisible(chr(c)))]
    ranges, first = [], codes[0]
    for previous, code in zip(codes, [*codes[1:], None], strict=True):
        if code != previous + 1:
            ranges.append((first, previous))
            first = code

    def char(c: int) -> str:
        return f"\\u{c:04x}" if c <= 0xFFFF else chr(c)
    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


def text_problem(value: str, limit: int | None = None, limit_name: str = "",
                 blank: bool = False) -> str | None:
    """What is wrong with `value` as incoming text, in one line, or None when it passes: not valid
    Unicode, a NUL, blank (unless `blank` is allowed), or longer than `limit` characters (named by
    its setting `limit_name`)."""
    at = lone_surrogate(value)
    if at is not None:
        return (f"is not valid Unicode: a lone surrogate U+{ord(value[at]):04X} at character {at} "
                "(send text as UTF-8)")
    if "\x00" in value:
        return f"cannot contain a NUL character (\\x00, at {value.index(chr(0))})"
    if limit is not None and len(value) > limit:
        return f"at most {limit} characters{f' ({limit_name})' if limit_name else ''}; got {len(value)}"
    if not blank and not visible(value):
        return "cannot be blank" if value == "" else "cannot be blank (it shows nothing: spaces, " \
                                                     "zero-width or other invisible characters only)"
    return None


def unrenderable(value: Any) -> str | None:
    """Where in `value` (a str, or lists, tuples and dicts of them, keys too, or a pydantic model's
    dump) a lone surrogate sits, as a path such as "values.0", or None when it all encodes as UTF-8."""
    if isinstance(value, str):
        return "" if lone_surrogate(value) is not None else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and lone_surrogate(key) is not None:
                return "(a key)"
            where = unrenderable(item)
            if where is not None:
                return f"{key}.{where}".rstrip(".") if isinstance(key, str) else where
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            where = unrenderable(item)
            if where is not None:
                return f"{i}.{where}".rstrip(".")
        return None
    return None


PLACEHOLDER = "\ufffd"  # what a lone surrogate of a stored row is shown as: the replacement character


def mend(value: Any) -> Any:
    """`value` (JSON data: str, lists, dicts, numbers) with every lone surrogate, in strings and keys,
    replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub(PLACEHOLDER, value)
    if isinstance(value, dict):
        return {mend(k): mend(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mend(item) for item in value]
    return value


def loads(text: str | bytes) -> Any:
    """`json.loads`, with lone surrogates (written as \\udXXX escapes) mended to U+FFFD: only JSON
    that escapes a surrogate at all is walked (a pair, such as an emoji's, is kept)."""
    value = json.loads(text)
    raw = text if isinstance(text, str) else text.decode("utf-8", "replace")
    return mend(value) if _ESCAPED_SURROGATE.search(raw) and unrenderable(value) is not None else value
