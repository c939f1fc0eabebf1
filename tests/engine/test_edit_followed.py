"""`edit_followed` on known pairs: does an answer name the field's new value, its old one, both or
neither, whatever the case, punctuation, articles, number words and date formats."""

from __future__ import annotations

import pytest

from vocabulary.verdicts import chosen, edit_followed, words


@pytest.mark.parametrize(("answer", "old", "new", "verdict"), [
    ("The account status is suspended.", ["active"], ["suspended"], "new"),   # access-policy
    ("The account status is active.", ["active"], ["suspended"], "old"),
    ("It was active, now it is suspended.", ["active"], ["suspended"], "both"),
    ("I cannot tell.", ["active"], ["suspended"], "neither"),
    ("The account is inactive", ["active"], ["inactive"], "new"),             # old inside the new word
    ("The account is active", ["active"], ["inactive"], "old"),
    ("It is not active any more", ["active"], ["not active"], "new"),         # old inside the new phrase
    ("The shipment goes to MADRID!", ["Oslo"], ["Madrid"], "new"),
    ("It docked in the Oslofjord", ["Oslo"], ["Madrid"], "neither"),          # whole tokens only
    ("New York City", ["New York"], ["New York City"], "new"),
    ("New York, of course", ["New York"], ["New York City"], "old"),
    ("three crates", ["2 crates"], ["3 crates"], "new"),
    ("Twenty-one days", ["14 days"], ["21 days"], "new"),
    ("1,000 units", ["500 units"], ["one thousand units"], "new"),
    ("Departs 9:30", ["08:15"], ["09:30"], "new"),
    ("It ships on 1 March 2026.", ["2026-02-14"], ["2026-03-01"], "new"),
    ("It ships on March 1st, 2026.", ["2026-02-14"], ["2026-03-01"], "new"),
    ("Due 2026/02/14", ["14 February 2026"], ["1 March 2026"], "old"),
    ("the Director of Sales", ["director of sales"], ["head of marketing"], "old"),
    ("The plan is basic", ["basic"], ["basic"], "neither"),                   # unchanged value
    ("Madrid, then Oslo", ["Oslo", "north"], ["Madrid", "south"], "both"),    # several fields
    ("south", ["Oslo", "north"], ["Madrid", "south"], "new"),
])
def test_known_pairs(answer, old, new, verdict):
    assert edit_followed(answer, old, new) == verdict


def test_with_choices_the_chosen_choice_is_the_answer():
    choices = ["Oslo", "Madrid"]
    assert edit_followed("madrid", ["Oslo"], ["Madrid"], choices) == "new"
    assert edit_followed(" Oslo.", ["Oslo"], ["Madrid"], choices) == "old"
    assert chosen("The answer is Madrid", choices) == "Madrid"
    assert chosen("Oslo or Madrid", choices) == "Oslo or Madrid"  # names both: not one choice
    # a yes/no choice names no value
    assert edit_followed("no", ["active"], ["suspended"], ["yes", "no"]) == "neither"


@pytest.mark.parametrize(("text", "tokens"), [
    ("The 3 crates left on 1 March 2026.", ["3", "crates", "left", "on", "2026-03-01"]),
    ("March 1, 2026 / 1st of March 2026 / 2026-3-1", ["2026-03-01"] * 3),
    ("two hundred and five, twenty two", ["205", "22"]),
    ("one and two", ["1", "and", "2"]),
    ("It's 3.50 kg", ["its", "3.5", "kg"]),
    ("at 09:05, 2.0 h, gate 007", ["at", "9", "5", "2", "h", "gate", "7"]),
])
def test_words(text, tokens):
    assert words(text) == tokens


def test_any_text_gets_a_verdict():
    odd = ["", "   ", "x² ½ Ⅻ ٣", "—", "The the a an", "2026-13-45", "one one one",
           "🙂 Madrid 🙂", "\x00Oslo"]
    verdicts = [edit_followed(text, ["Oslo"], ["Madrid"]) for text in odd]
    assert verdicts == ["neither"] * 7 + ["new", "old"]
    assert edit_followed("Oslo", [""], ["  "]) == "neither"  # blank values name nothing
