"""What changed between a prompt and its base: short spans, each with a name for the erratum.

Two ways to find them:

- **Template mode** (`Template`): a notebook's document with its fields as slots (a slot matches any
  text without a newline). A text that matches the template holds one value per field; a field whose
  value differs from the base's is a change, named by the field's label.
- **Diff mode** (`diff_changes`): a token diff against the base (tokens: words, runs of spaces,
  single punctuation marks; `difflib` without its junk heuristic). Each changed run becomes a span
  widened to whole tokens; it is named by the key of a `key: value` line it is the value of
  ("destination: Oslo" → "destination", the replay's `field_label`), else the erratum quotes the
  whole line before and after the change.

Both return `Change`s with character spans in the new text, so the layouts (`serving.gateway.layouts`)
can move or annotate them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
SLOT = r"([^\n]{0,200}?)"
MERGE_GAP = 3  # tokens


@dataclass(frozen=True)
class Change:
    """One changed span of message `message`: [start, end) in the new text, [base_start, base_end)
    in the base's; `label`, `old` and `new` are what the erratum says."""

    message: int
    start: int
    end: int
    base_start: int
    base_end: int
    label: str
    old: str
    new: str


@dataclass(frozen=True)
class Slot:
    """One field of a template: its label and its span in the template's document."""

    label: str
    start: int
    end: int


class Template:
    """A notebook's document with its fields as slots."""

    def __init__(self, document: str, slots: Sequence[Slot]) -> None:
        self.document = document
        self.slots = tuple(sorted(slots, key=lambda s: s.start))
        pieces, at = [], 0
        for slot in self.slots:
            pieces.append(re.escape(document[at:slot.start]))
            pieces.append(SLOT)
            at = slot.end
        pieces.append(re.escape(document[at:]))
        self._pattern = re.compile("".join(pieces), re.DOTALL)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(s.label for s in self.slots)

    def values(self, text: str) -> tuple[list[tuple[int, int]], int] | None:
        """The spans of the slots' values where the document stands in `text`, and where it ends;
        None when `text` does not hold the document."""
        found = self._pattern.search(text)
        if found is None:
            return None
        return [found.span(i + 1) for i in range(len(self.slots))], found.end()

    def changes(self, message: int, base: str, text: str) -> list[Change] | None:
        """The fields whose value in `text` differs from `base`'s; None when either does not hold the
        document."""
        old, new = self.values(base), self.values(text)
        if old is None or new is None:
            return None
        out = []
        for slot, (bs, be), (s, e) in zip(self.slots, old[0], new[0]):
            if base[bs:be] != text[s:e]:
                out.append(Change(message, s, e, bs, be, slot.label, base[bs:be], text[s:e]))
        return out


def _tokens(text: str) -> list[tuple[str, int]]:
    return [(m.group(), m.start()) for m in _TOKEN.finditer(text)]


def _line(text: str, start: int, end: int) -> tuple[int, int]:
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", end)
    return a, len(text) if b < 0 else b


def key_of(text: str, start: int) -> str | None:
    """The key of a `key: value` line whose value starts at `start`, else None."""
    head = text[text.rfind("\n", 0, start) + 1:start].rstrip()
    if head.endswith(":") and 0 < len(head) <= 60 and head[:-1].strip():
        return head[:-1].strip()
    return None


def _merged(opcodes: list, new: list[tuple[str, int]]) -> list[tuple[int, int, int, int]]:
    """The changed runs, a run and the next merged when at most `MERGE_GAP` tokens without a newline
    stand between them ("08:07" → "09:12" is one change, not two)."""
    runs: list[list[int]] = []
    gap_ok = False
    for op, i1, i2, j1, j2 in opcodes:
        if op == "equal":
            gap_ok = j2 - j1 <= MERGE_GAP and not any("\n" in t for t, _ in new[j1:j2])
            continue
        if runs and gap_ok:
            runs[-1][1], runs[-1][3] = i2, j2
        else:
            runs.append([i1, i2, j1, j2])
        gap_ok = False
    return [(a, b, c, d) for a, b, c, d in runs]


def diff_changes(message: int, base: str, text: str) -> list[Change]:
    """The changed spans of `text` against `base` by a token diff (see the module docstring). The
    common head and tail are set aside first (cut at a line start and a line end), so the diff reads
    only the lines between the first change and the last."""
    head = common_head(base, text)
    tail = common_tail(base, text, head)
    found = _diff(base[head:len(base) - tail], text[head:len(text) - tail], base, text, head)
    return [Change(message, c.start + head, c.end + head, c.base_start + head, c.base_end + head, c.label,
                   c.old, c.new) for c in found]


def _shared(equal, limit: int) -> int:
    """The largest n <= limit with equal(n) true (equal is monotone: true up to some n), by binary
    search over slice comparisons (C speed, not a Python loop per character)."""
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if equal(mid):
            low = mid
        else:
            high = mid - 1
    return low


def common_head(a: str, b: str) -> int:
    """Where the two texts' common head ends, cut back to a line start."""
    n = _shared(lambda k: a[:k] == b[:k], min(len(a), len(b)))
    return a.rfind("\n", 0, n) + 1


def common_tail(a: str, b: str, head: int) -> int:
    """How long the two texts' common tail is (not reaching into `head`), cut forward to a line end."""
    n = _shared(lambda k: k == 0 or a[-k:] == b[-k:], min(len(a), len(b)) - head)
    cut = a.find("\n", len(a) - n)
    return 0 if cut < 0 else len(a) - cut


def _diff(base_part: str, text_part: str, base: str, text: str, head: int) -> list[Change]:
    """The changes of `text_part` against `base_part` (both starting at `head` in their texts),
    spans relative to the parts; names read from the whole texts."""
    old, new = _tokens(base_part), _tokens(text_part)
    matcher = difflib.SequenceMatcher(None, [t for t, _ in old], [t for t, _ in new], autojunk=False)
    out = []
    for i1, i2, j1, j2 in _merged(matcher.get_opcodes(), new):
        bs = old[i1][1] if i1 < len(old) else len(base_part)
        be = old[i2 - 1][1] + len(old[i2 - 1][0]) if i2 > i1 else bs
        s = new[j1][1] if j1 < len(new) else len(text_part)
        e = new[j2 - 1][1] + len(new[j2 - 1][0]) if j2 > j1 else s
        old_value, new_value = base_part[bs:be], text_part[s:e]
        key = key_of(text, s + head) if "\n" not in old_value + new_value else None
        if key is not None and key == key_of(base, bs + head):
            out.append(Change(0, s, e, bs, be, key, old_value, new_value))
            continue
        la, lb = _line(base, bs + head, be + head)
        na, nb = _line(text, s + head, e + head)
        out.append(Change(0, s, e, bs, be, "the line", f'"{base[la:lb].strip()}"',
                          f'"{text[na:nb].strip()}"'))
    return out
