"""The field types of the API's request models: text with its limit, its rules and their schema.

A limit is read from settings when a request is validated (`at_most`; never once at import), and
stated in the OpenAPI schema as the settings say when the schema is made (`Documented`). Every text
type here (`_text`, and `by_label` for the keys of {label: value} objects) applies the one set of
text rules (`vocabulary.text_rules`): valid Unicode (no lone surrogate), its length cap, no NUL
(PostgreSQL cannot store it), and not blank (whitespace, zero-width or other format characters,
marks such as a lone combining accent or a variation selector, and blank letters such as U+3164
alone are blank), unless a type says blank or empty is allowed; the schema states NUL and blank as
one pattern (`VISIBLE_TEXT`). Models must be offered (`KVNOTES_MODELS`), listed as the schema's enum.
Ids in bodies are bounded by 2^53 - 1, what a JSON number (a double) carries exactly. Numbers are
JSON's (`Integer`, `Number`): a boolean or a string is never a number (`"start": false` is a 422,
not 0; 528.0 is the integer 528); every integer or number of a request model is one of these
(tests/api/test_fuzz.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    GetJsonSchemaHandler,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from data.contracts import unix_newlines
from data.settings import Settings, get_settings
from vocabulary.text_rules import invisible_class, lone_surrogate, text_problem, visible

MAX_APPEND_CHARS = 8000  # what one turn of a trajectory appends
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


# text that shows something (`_not_blank`) and holds no NUL (`_no_nul`), as the schema says it
VISIBLE_TEXT = f"^[^\\x00]*[^{invisible_class()}][^\\x00]*$"
ANY_TEXT = "^[^\\x00]*$"


def _valid_unicode(value: str) -> str:
    """No lone surrogate: text that is not valid Unicode can be neither stored as UTF-8 nor shown."""
    at = lone_surrogate(value)
    if at is not None:
        raise ValueError(text_problem(value))
    return value


def _not_blank(value: str) -> str:
    if not visible(value):
        raise ValueError("cannot be blank")
    return value


def _no_nul(value: str) -> str:
    """PostgreSQL cannot store NUL in text, and no document needs it: refused like the forms refuse it."""
    if "\x00" in value:
        raise ValueError(text_problem(value))
    return value


def at_most(setting: str | int, key: str = "maxLength") -> tuple[AfterValidator, Documented]:
    """A length limit read from settings when a request is validated (never once at import): the
    field's characters, or a list's items (`key="maxItems"`), at most `Settings.<setting>`, named by
    its variable in the message (or a fixed number of them); the schema states the same limit."""
    variable = Settings.model_fields[setting].validation_alias if isinstance(setting, str) else ""

    def limit() -> int:
        return getattr(get_settings(), setting) if isinstance(setting, str) else setting

    def check(value: str | list) -> str | list:
        if len(value) > limit():
            unit = "characters" if isinstance(value, str) else "items"
            named = f" ({variable})" if variable else ""
            raise ValueError(f"at most {limit()} {unit}{named}; got {len(value)}")
        return value

    return AfterValidator(check), Documented(lambda: {key: limit()})


def _within_document(offset: int) -> int:
    limit = get_settings().max_document_chars
    if offset > limit:
        raise ValueError(f"at most {limit} (KVNOTES_MAX_DOCUMENT_CHARS); got {offset}")
    return offset


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _empty_or_visible(value: str) -> str:
    if value and not visible(value):
        raise ValueError("cannot be blank: leave it empty, or give text that shows")
    return value


def _text(setting: str | int, *more: AfterValidator, blank: bool = False, empty: bool = False) -> Any:
    """A text field by the text rules (`vocabulary.text_rules`): valid Unicode, its limit (per call),
    no NUL, not blank (`blank`: anything that passes the rest; `empty`: "" meaning "none" or "the
    default", anything else must show), then `more`."""
    shows = VISIBLE_TEXT if not empty else f"^$|{VISIBLE_TEXT}"
    pattern = Documented(lambda: {"pattern": ANY_TEXT if blank else shows})
    rule = [] if blank else [AfterValidator(_empty_or_visible) if empty else NotBlank]
    checks = [AfterValidator(_valid_unicode), *at_most(setting), AfterValidator(_no_nul), *rule, pattern,
              *more]
    return Annotated[(str, StringConstraints(min_length=0 if blank or empty else 1), *checks)]


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
Label = _text("max_label_chars", empty=True)  # "" = no label; a label that shows nothing is refused
Value = _text("max_value_chars")
ErratumText = _text("max_erratum_chars", AfterValidator(unix_newlines))
SkillText = _text("max_skill_chars", AfterValidator(unix_newlines))
SkillName = _text("max_label_chars")
QuestionText = _text("max_question_chars")
Choice = _text("max_label_chars")
Choices = Annotated[list[Choice], *at_most("max_choices", "maxItems")]
FieldLabel = _text("max_label_chars")  # a field named by its label (a sweep's column, a turn's change)


def by_label(value_type: Any, items: int | None = None) -> Any:
    """{field label: value_type}: each key passes the text rules as a `FieldLabel` does (checked
    here, stated as the schema's `propertyNames`, so generated keys need not match a pattern
    property), at most `items` keys."""
    rules = TypeAdapter(FieldLabel)

    def check(value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            try:
                rules.validate_python(key)
            except ValidationError as exc:
                message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
                raise ValueError(f"the label {safe_quote(key)}: {message}") from None
        return value

    names = Documented(lambda: {"propertyNames": {"type": "string", "minLength": 1, "pattern": VISIBLE_TEXT,
                                                  "maxLength": get_settings().max_label_chars}})
    bounds = [Field(max_length=items)] if items is not None else []
    return Annotated[dict[str, value_type], *bounds, AfterValidator(check), names]


def safe_quote(value: str, limit: int = 40) -> str:
    """`value` quoted for a message: at most `limit` characters, lone surrogates escaped."""
    cut = value[:limit] + ("…" if len(value) > limit else "")
    return "'" + cut.encode("utf-8", "backslashreplace").decode("utf-8") + "'"


Cell = _text("max_value_chars", blank=True)  # a sweep row's cell: a blank one is refused by row and column
AppendText = _text(MAX_APPEND_CHARS, empty=True)  # "" appends nothing
ServerUrl = _text(500, empty=True)  # "" = the configured server
ServedModelName = _text("max_label_chars", empty=True)  # "" = the one model the server serves
StrategyName = _text(64)  # a strategy (or a trajectory's `name.one_per_field`), then checked by name
Offset = Annotated[int, Field(ge=0, le=MAX_DB_ID), JSON_INT, AfterValidator(_within_document),
                   Documented(lambda: {"maximum": get_settings().max_document_chars})]
