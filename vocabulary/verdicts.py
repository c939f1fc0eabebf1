"""Did an answer follow the edit? `edit_followed` says whether an answer names a field's new value,
its old one, both or neither.

Values are matched as whole phrases on normalised token boundaries: case, punctuation and articles
are dropped, numbers written as words become digits ("three" → "3", "twenty-one" → "21", "1,000" →
"1000", "09" → "9", "3.50" → "3.5") and dates written in any common form become one ISO token
("1 March 2026", "March 1st, 2026" and "2026/03/01" → "2026-03-01"). So "Oslo" does not match
"Oslofjord", "active" does not match "inactive", and an old value found only inside a new one
("New York" in "New York City") does not count as the old value. Stdlib only: the engine fills the
verdict, the web app reads the words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FOLLOWED = ("new", "old", "both", "neither")

# ---- dates ---------------------------------------------------------------------------------------

_MONTHS = {name: number for number, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sept", "sep"),
    ("october", "oct"), ("november", "nov"), ("december", "dec")), start=1) for name in names}
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
_DATES = tuple(re.compile(pattern, re.IGNORECASE) for pattern in (
    r"\b(?P<year>\d{4})[-/.](?P<month>\d{1,2})[-/.](?P<day>\d{1,2})\b",   # 2026-03-01, 2026/3/1
    rf"\b{_DAY}(?:\s+of)?\s+{_MONTH},?\s+{_YEAR}\b",                    # 1 March 2026, 1st of March, 2026
    rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b",                              # March 1, 2026
))


def _iso_date(match: re.Match[str]) -> str:
    """The matched date as one ISO token, or the text unchanged when it is not a real date."""
    month = match["month"].lower().rstrip(".")
    month_number = int(month) if month.isdigit() else _MONTHS[month]
    day = int(match["day"])
    if not (1 <= month_number <= 12 and 1 <= day <= 31):
        return match[0]
    return f" {int(match['year']):04d}-{month_number:02d}-{day:02d} "


def _dates_as_tokens(text: str) -> str:
    for pattern in _DATES:
        text = pattern.sub(_iso_date, text)
    return text


# ---- numbers -------------------------------------------------------------------------------------

_UNITS = {word: n for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {word: 10 * n for n, word in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}


def _kind(word: str) -> str | None:
    """unit (0-9), teen (10-19), ten (20, 30, …), hundred, scale (thousand and up), or None."""
    if word in _UNITS:
        return "unit" if _UNITS[word] < 10 else "teen"
    if word in _TENS:
        return "ten"
    return {"hundred": "hundred"}.get(word, "scale" if word in _SCALES else None)


# Which kind of number word may follow which ("twenty one", "two hundred", not "two two" or "ten one").
_MAY_FOLLOW = {
    "unit": {None, "ten", "hundred", "scale"}, "teen": {None, "hundred", "scale"},
    "ten": {None, "hundred", "scale"}, "hundred": {"unit", "teen", "ten"},
    "scale": {"unit", "teen", "ten", "hundred"},
}


def _number_words(tokens: list[str], start: int) -> tuple[int, int] | None:
    """(value, tokens used) of a number written in words from `start` ("twenty one", "two hundred
    and five"), or None when no number word starts there."""
    total, current, last, end, i = 0, 0, None, start, start
    while i < len(tokens):
        word = tokens[i]
        if word == "and" and last in ("hundred", "scale") and i + 1 < len(tokens):
            i, word = i + 1, tokens[i + 1]  # "two hundred and five"
        kind = _kind(word)
        if kind is None or last not in _MAY_FOLLOW[kind]:
            break
        if kind == "hundred":
            current *= 100
        elif kind == "scale":
            total, current = total + current * _SCALES[word], 0
        else:
            current += _UNITS.get(word, 0) + _TENS.get(word, 0)
        last, i = kind, i + 1
        end = i
    return (total + current, end - start) if end > start else None


def _numbers_as_digits(tokens: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(tokens):
        number = _number_words(tokens, i)
        if number is None:
            out.append(tokens[i])
            i += 1
        else:
            out.append(str(number[0]))
            i += number[1]
    return out


# ---- tokens --------------------------------------------------------------------------------------

_ARTICLES = {"a", "an", "the"}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")
_APOSTROPHE = re.compile(r"['’]")
_TOKEN = re.compile(r"\d{4}-\d{2}-\d{2}|\d+(?:\.\d+)?|[^\W_]+")  # an ISO date, a number, a word
_DECIMAL = re.compile(r"\d+\.\d+")


def words(text: str) -> list[str]:
    """`text` as the matcher compares it: lower-case tokens without punctuation or articles, numbers
    as digits, dates as one ISO token ("The 3 crates left on 1 March 2026." →
    ["3", "crates", "left", "on", "2026-03-01"])."""
    text = _dates_as_tokens(text.lower())
    text = _ORDINAL.sub(r"\1", _THOUSANDS.sub("", _APOSTROPHE.sub("", text)))
    tokens = [_plain_number(token) for token in _TOKEN.findall(text) if token not in _ARTICLES]
    return _numbers_as_digits(tokens)


def _plain_number(token: str) -> str:
    """A number without leading zeros or a trailing ".0" ("09" → "9", "3.50" → "3.5"); other tokens
    unchanged."""
    if token.isdecimal():  # not isdigit: "²" is a digit int() refuses
        return str(int(token))
    if _DECIMAL.fullmatch(token):
        whole, fraction = token.split(".")
        fraction = fraction.rstrip("0")
        return str(int(whole)) + (f".{fraction}" if fraction else "")
    return token


def _spans(haystack: list[str], phrase: list[str]) -> list[tuple[int, int]]:
    """Every [start, end) where `phrase` occurs in `haystack` as whole tokens."""
    n = len(phrase)
    return [(i, i + n) for i in range(len(haystack) - n + 1) if haystack[i:i + n] == phrase]


def _phrases(values: Sequence[str]) -> list[list[str]]:
    return [phrase for phrase in map(words, values) if phrase]


def _inside(span: tuple[int, int], others: list[tuple[int, int]]) -> bool:
    """`span` lies within a longer span of `others` (an old value read only as part of a new one)."""
    return any(o[0] <= span[0] and span[1] <= o[1] and o[1] - o[0] > span[1] - span[0] for o in others)


def chosen(answer: str, choices: Sequence[str]) -> str:
    """With choices, the choice the answer is: the one equal to it after normalisation, else the only
    one it names; otherwise the answer itself."""
    said = words(answer)
    named = [choice for choice in choices if words(choice) == said]
    if not named:
        named = [choice for choice in choices if words(choice) and _spans(said, words(choice))]
    return named[0] if len(named) == 1 else answer


def edit_followed(answer: str, old: Sequence[str], new: Sequence[str], choices: Sequence[str] = ()) -> str:
    """"new" when `answer` names a new value and no old one, "old" for the reverse, else "both" or
    "neither". A value both lists hold (a field whose wording changed but not its value) names
    neither side; an old value counted only inside a longer new value (or the reverse) is dropped."""
    said = words(chosen(answer, choices) if choices else answer)
    old_phrases, new_phrases = _phrases(old), _phrases(new)
    old_phrases, new_phrases = ([p for p in old_phrases if p not in new_phrases],
                                [p for p in new_phrases if p not in old_phrases])
    old_spans = [span for phrase in old_phrases for span in _spans(said, phrase)]
    new_spans = [span for phrase in new_phrases for span in _spans(said, phrase)]
    names_old = any(not _inside(span, new_spans) for span in old_spans)
    names_new = any(not _inside(span, old_spans) for span in new_spans)
    verdicts = {(True, False): "new", (False, True): "old", (True, True): "both"}
    return verdicts.get((names_new, names_old), "neither")


def outside_choices(values: list[str], choices: list[str], field_values: list[str]) -> list[str]:
    """The values no choice names, when the choices name the field's values (a choice is its old or
    new value; yes/no choices name none and take any value): those answers could never agree. A
    serving replay and a sweep refuse them, or extend the choices with them on request."""
    said = {tuple(words(choice)) for choice in choices}
    if not any(tuple(words(value)) in said for value in field_values):
        return []
    return list(dict.fromkeys(value for value in values if tuple(words(value)) not in said))
