"""One meaning of "agrees" (issue 43), used by every view: the run table, sweeps, trajectories,
`auto`, the sweep policy, the gateway's checks and the mechanism views.

Two answers agree when they *decide* the same:
- a choice question: the same choice (`vocabulary.verdicts.chosen`, so "Active." is "active");
- a free answer whose reference names a field's value: the same `edit_followed` verdict naming the
  same values. "The account status is suspended." agrees with "The account is suspended.": a pure
  wording difference never counts;
- a free answer whose reference names no value (no field changed, or recompute names neither): the
  decision cannot be read from the words, so the rule falls back to the first answer token (the
  most likely first token is recompute's) and says so (`basis` = FIRST_TOKEN). Where that token is
  not known (an answer read back without logits), the normalised words are compared (`WORDS`).

Stdlib only: the engine fills `agrees`, the web app reads the words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from vocabulary.prefix import common_prefix
from vocabulary.verdicts import _inside, _phrases, _spans, chosen, words

NAMED = ("new", "old", "both")  # verdicts that name a value: only these decide a free answer

CHOICE, VALUE, FIRST_TOKEN, WORDS = "choice", "value", "first token", "words"
BASIS_WORDS = {
    CHOICE: "the same choice",
    VALUE: "names the same value",
    FIRST_TOKEN: "first-token comparison: recompute's answer names no value",
    WORDS: "same words: recompute's answer names no value",
}


@dataclass(frozen=True)
class Agreement:
    """Whether an answer decides as the reference does, and on what basis (`BASIS_WORDS`)."""

    agrees: bool
    basis: str

    @property
    def words(self) -> str:
        return BASIS_WORDS[self.basis]


def named_values(answer: str, values: Sequence[str]) -> frozenset[tuple[str, ...]]:
    """The values (as normalised phrases) that `answer` names; a value read only inside a longer
    named one ("New York" in "New York City") is not named."""
    said = words(answer)
    spans = {tuple(p): _spans(said, p) for p in _phrases(values)}
    every = [s for found in spans.values() for s in found]
    return frozenset(p for p, found in spans.items()
                     if any(not _inside(span, every) for span in found))


def by_verdict(mine: str | None, reference: str | None, fallback: bool | None, *,
               same_values: bool = True, fallback_basis: str = FIRST_TOKEN) -> Agreement:
    """The rule on stored verdicts (no answer text at hand): when the reference's `edit_followed`
    names a value, the same verdict (and `same_values`, where known) agrees whatever the wording;
    otherwise `fallback` decides (the first-token comparison, or the words when no token was kept)
    under its label."""
    if reference in NAMED:
        return Agreement(mine == reference and same_values, VALUE)
    return Agreement(bool(fallback), fallback_basis)


def agreement(answer: str, reference: str, *, choices: Sequence[str] = (), values: Sequence[str] = (),
              first_token: bool | None = None) -> Agreement:
    """Does `answer` decide as `reference` does? `choices`: a choice question's; `values`: every
    value the fields hold or held (old and new); `first_token`: whether the two answers' most likely
    first tokens are the same (the fallback where the reference names no value). Where the
    reference names values, the answer agrees when it names the same ones: the same
    `edit_followed` verdict naming the same value, whatever else it says."""
    if choices:
        mine, theirs = chosen(answer, choices), chosen(reference, choices)
        if words(theirs) in [words(c) for c in choices]:
            return Agreement(words(mine) == words(theirs), CHOICE)
    named = named_values(reference, values)
    if named:
        return Agreement(named_values(answer, values) == named, VALUE)
    if first_token is not None:
        return Agreement(first_token, FIRST_TOKEN)
    return Agreement(words(answer) == words(reference), WORDS)


def agrees(answer: str, reference: str, *, choices: Sequence[str] = (), values: Sequence[str] = (),
           first_token: bool | None = None) -> bool:
    """`agreement(...).agrees`: the one test every view calls."""
    return agreement(answer, reference, choices=choices, values=values, first_token=first_token).agrees


def decision_key(decision: str, followed: str | None, choice: bool) -> str | None:
    """What a sweep counts under the rule: a choice question's choice (normalised words), or a free
    answer's `edit_followed` verdict when it names one side ("new" or "old"; None, undetermined,
    otherwise: a sweep's edit counts only where recompute's answer names a value)."""
    if choice:
        return " ".join(words(decision)) or None
    return followed if followed in ("new", "old") else None


@dataclass(frozen=True)
class DecidingToken:
    """Where the mechanism views read a free answer (issue 43): the answer token `index` (0: the
    first), teacher-forcing the reference's answer before it, and why there (`why`, for people)."""

    index: int
    why: str


def value_token(prefixes: Sequence[str], values: Sequence[str]) -> int | None:
    """The answer token where the answer first names one of `values` and tells it from the others:
    `prefixes[t]` is the decoded text of the answer's tokens 0..t. The token holding the first
    character where the named value parts from every other value (found as a whole word, any case):
    for "New York" against "New Jersey" the token of "York", for 09:07 against 09:12 the token of
    "07", since the tokens before it are the same whichever value the answer names. Failing a whole
    word (a value named in other words: "three" for "3"), the token that completes it. None when
    the answer names no value."""
    if not prefixes:
        return None
    full = prefixes[-1]
    found = [(m.start(), -len(value.strip()), value.strip()) for value in values if value.strip() for m in
             [re.search(r"(?<!\w)" + re.escape(value.strip()) + r"(?!\w)", full, re.IGNORECASE)] if m]
    if found:
        start, _, named = min(found)
        others = [v.strip().casefold() for v in values
                  if v.strip() and v.strip().casefold() != named.casefold()]
        shared = max((common_prefix(named.casefold(), other) for other in others), default=0)
        at = start + min(shared, len(named) - 1)
        return next((t for t, text in enumerate(prefixes) if len(text) > at), len(prefixes) - 1)
    return next((t for t, text in enumerate(prefixes) if named_values(text, values)), None)


def deciding_token(prefixes: Sequence[str], values: Sequence[str], reference_ids: Sequence[int],
                   floor_ids: Sequence[int] | None) -> DecidingToken:
    """Where to read a free answer's decision: the token where the reference's answer first names
    a value; else the first token where the reference's and the floor's (stale's) answers differ;
    else the first token. Each says which it is."""
    at = value_token(prefixes, values)
    if at is not None:
        return DecidingToken(at, "where recompute's answer first names a value")
    if floor_ids is not None:
        differ = next((t for t, (a, b) in enumerate(zip(reference_ids, floor_ids, strict=False)) if a != b),
                      None)
        if differ is None and len(reference_ids) != len(floor_ids):
            differ = min(len(reference_ids), len(floor_ids))
        if differ is not None and differ < len(reference_ids):
            return DecidingToken(differ, "recompute's answer names no value: the first token where "
                                         "recompute's and stale's answers differ")
    return DecidingToken(0, "recompute's answer names no value and stale's does not differ: the first "
                            "answer token")


def around(text: str, values: Sequence[str], width: int = 40) -> tuple[str, str, str]:
    """`text` cut to about `width` characters around the first value it names (issue 43: a cut
    answer still shows its value), as (before, value, after) with "…" where it was cut. Naming none:
    (the text cut from its end, "", "")."""
    found = [m for value in values if value.strip() for m in
             [re.search(r"(?<!\w)" + re.escape(value.strip()) + r"(?!\w)", text, re.IGNORECASE)] if m]
    if not found:
        return (text if len(text) <= width else text[:width - 1].rstrip() + "…"), "", ""
    m = min(found, key=lambda m: m.start())
    before, value, after = text[:m.start()], m.group(), text[m.end():]
    room = max(width - len(value), 0)
    keep_after = min(len(after), room // 2)
    keep_before = min(len(before), room - keep_after)
    keep_after = min(len(after), room - keep_before)
    if keep_before < len(before):  # cut at a word boundary, never inside a word
        kept = before[len(before) - keep_before:]
        if " " in kept and not before[-keep_before - 1:].startswith(" "):
            kept = kept[kept.find(" ") + 1:]
        before = "…" + kept.lstrip()
    if keep_after < len(after):
        kept = after[:keep_after]
        kept = kept[:kept.rfind(" ")] if " " in kept and not after[keep_after:].startswith(" ") else kept
        after = kept.rstrip() + "…"
    return before, value, after
