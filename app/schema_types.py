"""The field types of the API's request models: text with its limit, its rules and their schema.

A limit is read from settings when a request is validated (`at_most`; never once at import), and
stated in the OpenAPI schema as the settings say when the schema is made (`Documented`). Text must
show something (`_not_blank`: whitespace, zero-width or other format characters, marks such as a
lone combining accent or a variation selector, and blank letters such as U+3164 alone are blank)
and hold no NUL (`_no_nul`; PostgreSQL cannot store it); the schema states both as one
pattern (`VISIBLE_TEXT`). Models must be offered (`KVNOTES_MODELS`), listed as the schema's enum.
Ids in bodies are bounded by 2^53 - 1, what a JSON number (a double) carries exactly. Numbers are
JSON's (`Integer`, `Number`): a boolean or a string is never a number (`"start": false` is a 422,
not 0; 528.0 is the integer 528); every integer or number of a request model is one of these
(tests/api/test_fuzz.py).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, GetJsonSchemaHandler, StringConstraints
from pydantic_core import PydanticCustomError

from data.contracts import unix_newlines
from data.settings import Settings, get_settings

MAX_DB_ID = 2**53 - 1  # ids in bodies: the largest integer a JSON number (a double) carries exactly


@dataclass(frozen=True)
class Documented:
    """Adds `describe()` to a field's JSON schema when the schema is made, so the OpenAPI schema
    states a limit read from settings (as the validators read it), a model list or a pattern."""

    describe: Callable[[], dict[str, Any]]

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = handler(core_schema)
        schema.update(self.describe())
        return schema


# Characters that show nothing though Unicode gives them a letter's or symbol's category: the Hangul
# fillers (U+115F, 1160, 3164, FFA0) and the blank Braille pattern (U+2800).
_BLANK_LETTERS = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800})
# Marks (combining accents, variation selectors such as FE0F and E0100, the combining grapheme
# joiner 034F) and format characters (zero-width space, BOM, …) show nothing alone.
_SHOWS_NOTHING = frozenset({"Cf", "Mn", "Me", "Mc", "Cc", "Zl", "Zp", "Zs"})  # not unassigned (Cn): a
# pattern listing every unassigned code point is too large for schema tools to honour


def _invisible(ch: str) -> bool:
    return ch.isspace() or ord(ch) in _BLANK_LETTERS or unicodedata.category(ch) in _SHOWS_NOTHING


def _invisible_class() -> str:
    """A regex character class body of every character `_visible` does not count: whitespace,
    format characters and marks alone, blank letters (`_BLANK_LETTERS`), and NUL."""
    codes = [c for c in range(sys.maxunicode + 1) if c == 0 or _invisible(chr(c))]
    ranges, first = [], codes[0]
    for previous, code in zip(codes, [*codes[1:], None], strict=True):
        if code != previous + 1:
            ranges.append((first, previous))
            first = code
    def char(c: int) -> str:
        return f"\\u{c:04x}" if c <= 0xFFFF else chr(c)
    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


# text that shows something (`_not_blank`) and holds no NUL (`_no_nul`), as the schema says it
VISIBLE_TEXT = f"^[^\\x00]*[^{_invisible_class()}][^\\x00]*$"
ANY_TEXT = "^[^\\x00]*$"


def _visible(value: str) -> bool:
    """Has `value` a character that shows: not whitespace, a format character, a mark (a lone
    combining accent, a variation selector), a control, nor a blank letter?"""
    return not all(_invisible(ch) for ch in value)


def _not_blank(value: str) -> str:
    if not _visible(value):
        raise ValueError("cannot be blank")
    return value


def _no_nul(value: str) -> str:
    """PostgreSQL cannot store NUL in text, and no document needs it: refused like the forms refuse it."""
    if "\x00" in value:
        raise ValueError(f"cannot contain a NUL character (\\x00, at {value.index(chr(0))})")
    return value


def at_most(setting: str, key: str = "maxLength") -> tuple[AfterValidator, Documented]:
    """A length limit read from settings when a request is validated (never once at import): the
    field's characters, or a list's items (`key="maxItems"`), at most `Settings.<setting>`, named by
    its variable in the message; the schema states the same limit."""
    variable = Settings.model_fields[setting].validation_alias

    def check(value: str | list) -> str | list:
        limit = getattr(get_settings(), setting)
        if len(value) > limit:
            unit = "characters" if isinstance(value, str) else "items"
            raise ValueError(f"at most {limit} {unit} ({variable}); got {len(value)}")
        return value

    return AfterValidator(check), Documented(lambda: {key: getattr(get_settings(), setting)})


def _within_document(offset: int) -> int:
    limit = get_settings().max_document_chars
    if offset > limit:
        raise ValueError(f"at most {limit} (KVNOTES_MAX_DOCUMENT_CHARS); got {offset}")
    return offset


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _text(setting: str, *more: AfterValidator, blank: bool = False) -> Any:
    """A text field: its limit (per call), no NUL, not blank unless `blank`, then `more`."""
    pattern = Documented(lambda: {"pattern": ANY_TEXT if blank else VISIBLE_TEXT})
    checks = [*at_most(setting), AfterValidator(_no_nul), *([] if blank else [NotBlank]), pattern, *more]
    return Annotated[(str, StringConstraints(min_length=0 if blank else 1), *checks)]


NotBlank = AfterValidator(_not_blank)
Timestamp = Annotated[datetime, AfterValidator(_utc)]


def _json_number(kind: str, word: str) -> BeforeValidator:
    """Refuse what lax pydantic would read as a number but JSON does not call one: a boolean
    (`false` is not 0) or a string ("5"); integral numbers such as 528.0 are integers, as in JSON."""
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            got = "a boolean" if isinstance(value, bool) else type(value).__name__
            raise PydanticCustomError(f"{kind}_type", f"Input should be {word} (a JSON number, not {got})")
        return value
    return BeforeValidator(check)


JSON_INT, JSON_NUMBER = _json_number("int", "an integer"), _json_number("float", "a number")
# (after a Field's bounds in Annotated, or the schema states them as "ge"/"le" instead of "minimum")
Integer = Annotated[int, JSON_INT]  # 528.0 too; never a boolean or a string
Number = Annotated[float, JSON_NUMBER]  # a JSON number: never a boolean or a string
DbId = Annotated[int, Field(ge=1, le=MAX_DB_ID), JSON_INT]
Title = _text("max_title_chars")


def _served(name: str) -> str:
    """A notebook or skill may only name a model some worker serves (`KVNOTES_MODELS`): a run for
    any other would wait in a queue no worker reads."""
    offered = get_settings().models
    if name not in offered:
        raise ValueError(f"model {name!r} is not served here; "
                         f"choose one of {', '.join(offered)} (KVNOTES_MODELS)")
    return name


ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_served),
                      Documented(lambda: {"enum": get_settings().models})]
DocumentText = _text("max_document_chars", AfterValidator(unix_newlines))
Label = _text("max_label_chars", blank=True)
Value = _text("max_value_chars")
ErratumText = _text("max_erratum_chars", AfterValidator(unix_newlines))
SkillText = _text("max_skill_chars", AfterValidator(unix_newlines))
SkillName = _text("max_label_chars")
QuestionText = _text("max_question_chars")
Choice = _text("max_label_chars")
Choices = Annotated[list[Choice], *at_most("max_choices", "maxItems")]
Offset = Annotated[int, Field(ge=0, le=MAX_DB_ID), JSON_INT, AfterValidator(_within_document),
                   Documented(lambda: {"maximum": get_settings().max_document_chars})]
