"""What changed between a prompt and its base: short spans, each with a name for the erratum.

Two ways to find them:

- **Template mode** (`Template`): a notebook's document with its fields as slots (a slot matches any
  text without a newline). A text that matches the template holds one value per field; a field whose
  value differs from the base's is a change, named by the field's label.
- **Diff mode** (`diff_changes`): lines first, then tokens only inside the changed lines. The
  lines are compared by equality (each line hashed once, an index of where each line stands), walking
  both texts together: a mismatch resynchronises at the nearest line the two share again (`_resync`),
  so the cost is linear in the lines plus a small bounded search per changed block, never quadratic.
  Inside a changed block of lines, a token diff (tokens: words, runs of spaces, single punctuation
  marks; `difflib` without its junk heuristic) on at most `TOKEN_DIFF_CHARS` characters (a larger
  block, after its common head and tail are set aside, is one change). Each changed run becomes a
  span widened to whole tokens; it is named by the key of a `key: value` line it is the value of
  ("destination: Oslo" → "destination", the replay's `field_label`), else the erratum quotes the
  whole line before and after the change. The walk stops once more than `limit` changes are found
  (`--max-fields`: such a request passes through anyway).

Both return `Change`s with character spans in the new text, so the layouts (`serving.gateway.layouts`)
can move or annotate them.
"""

from __future__ import annotations

import difflib
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
SLOT = r"([^\n]{0,200}?)"
MERGE_GAP = 3  # tokens
TOKEN_DIFF_CHARS = 20_000  # the largest changed block diffed by tokens (difflib is quadratic at worst)
LOOKAHEAD = 64  # lines read ahead on each side to resynchronise after a changed line
QUOTE_CHARS = 400  # the longest line an erratum quotes whole
QUOTE_AROUND = 100  # else, the characters it quotes either side of the change
ANCHOR_TRIES = 8  # places tried per line read ahead (a repeated line: the nearest that confirms)


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
    # the changed text itself where the erratum quotes whole lines (diff mode, no key): what a
    # check's answers may name; "" when `old` / `new` are the values already
    old_value: str = ""
    new_value: str = ""

    @property
    def values(self) -> tuple[str, str]:
        """The old and new value an answer may name (never a quoted line)."""
        return self.old_value or self.old, self.new_value or self.new


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


# --- lines ---------------------------------------------------------------------------------------------

class _Lines:
    """A text's lines (each with its newline), where each starts, and where each line stands."""

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        for i in range(len(self.lines) - 1):
            self.lines[i] += "\n"
        if self.lines[-1] == "":
            self.lines.pop()
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self._index: dict[str, list[int]] | None = None

    def __len__(self) -> int:
        return len(self.lines)

    def at(self, line: str, start: int, end: int) -> list[int]:
        """Where `line` stands in [start, end), nearest first, at most `ANCHOR_TRIES` of them."""
        if self._index is None:
            self._index = {}
            for i, text in enumerate(self.lines):
                self._index.setdefault(text, []).append(i)
        found = self._index.get(line, [])
        first = bisect_left(found, start)
        return [i for i in found[first:first + ANCHOR_TRIES] if i < end]


def _confirmed(a: _Lines, b: _Lines, i: int, j: int, end_a: int, end_b: int) -> bool:
    """Whether lines a[i] and b[j] (equal) may end a changed block: the next lines agree too, or one
    text's middle ends there, or the line says something (not blank or a lone bracket)."""
    if i + 1 >= end_a or j + 1 >= end_b or a.lines[i + 1] == b.lines[j + 1]:
        return True
    return len(a.lines[i].strip()) > 2


def _resync(a: _Lines, b: _Lines, i: int, j: int, end_a: int, end_b: int) -> tuple[int, int]:
    """After a[i] != b[j]: the nearest lines (x, y), x >= i, y >= j, that are equal again (the fewest
    lines changed, x - i + y - j); (end_a, end_b) when none is found within `LOOKAHEAD` lines."""
    best, cost = (end_a, end_b), (end_a - i) + (end_b - j)
    for step in range(min(LOOKAHEAD, max(end_a - i, end_b - j))):
        if step >= cost:
            break
        if i + step < end_a:  # a line of `a` ahead, found in `b`
            for y in b.at(a.lines[i + step], j, end_b):
                if step + y - j < cost and _confirmed(a, b, i + step, y, end_a, end_b):
                    best, cost = (i + step, y), step + y - j
                    break
        if j + step < end_b:  # a line of `b` ahead, found in `a`
            for x in a.at(b.lines[j + step], i, end_a):
                if x - i + step < cost and _confirmed(a, b, x, j + step, end_a, end_b):
                    best, cost = (x, j + step), x - i + step
                    break
    return best


def _line_blocks(a: _Lines, b: _Lines, limit: int | None) -> list[tuple[int, int, int, int]]:
    """The changed blocks of lines [i1, i2) of `a` against [j1, j2) of `b`, in order; at most
    `limit` + 1 of them."""
    n, m = len(a), len(b)
    head = 0
    while head < n and head < m and a.lines[head] == b.lines[head]:
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and a.lines[n - 1 - tail] == b.lines[m - 1 - tail]:
        tail += 1
    end_a, end_b = n - tail, m - tail
    blocks: list[tuple[int, int, int, int]] = []
    i = j = head
    while i < end_a or j < end_b:
        if i < end_a and j < end_b and a.lines[i] == b.lines[j]:
            i, j = i + 1, j + 1
            continue
        x, y = _resync(a, b, i, j, end_a, end_b) if i < end_a and j < end_b else (end_a, end_b)
        blocks.append((i, x, j, y))
        if limit is not None and len(blocks) > limit:
            break
        i, j = x, y
    return blocks


# --- tokens inside a changed block ----------------------------------------------------------------------

def _kind(ch: str) -> int:
    return 0 if ch.isalnum() or ch == "_" else 1 if ch.isspace() else 2


def _token_start(text: str, at: int, low: int) -> int:
    """The start of the token holding text[at] (a punctuation mark is a token alone), not before
    `low`."""
    if at <= low or at >= len(text) or _kind(text[at]) == 2 or _kind(text[at - 1]) != _kind(text[at]):
        return at
    kind = _kind(text[at])
    while at > low and _kind(text[at - 1]) == kind:
        at -= 1
    return at


def _token_end(text: str, at: int, high: int) -> int:
    """The end of the token that ends at or after `at` (see `_token_start`), not past `high`."""
    if at <= 0 or at >= high or _kind(text[at - 1]) == 2 or _kind(text[at - 1]) != _kind(text[at]):
        return at
    kind = _kind(text[at])
    while at < high and _kind(text[at]) == kind:
        at += 1
    return at


def diff_changes(message: int, base: str, text: str, limit: int | None = None) -> list[Change]:
    """The changed spans of `text` against `base` (see the module docstring): lines first, then
    tokens inside the changed lines; at most `limit` + 1 changes (more than `limit`: stop)."""
    old_lines, new_lines = _Lines(base), _Lines(text)
    out: list[Change] = []
    for i1, i2, j1, j2 in _line_blocks(old_lines, new_lines, limit):
        if i2 - i1 == j2 - j1 > 1:  # as many lines replaced as there were: line by line
            pairs = [(i, j1 + i - i1, i + 1, j1 + i - i1 + 1) for i in range(i1, i2)
                     if old_lines.lines[i] != new_lines.lines[j1 + i - i1]]
        else:
            pairs = [(i1, j1, i2, j2)]
        for a, b, a_end, b_end in pairs:
            out += _block(message, base, text, old_lines.starts[a], old_lines.starts[a_end],
                          new_lines.starts[b], new_lines.starts[b_end])
            if limit is not None and len(out) > limit:
                return out[:limit + 1]
    return out


def _block(message: int, base: str, text: str, bs: int, be: int, s: int, e: int) -> list[Change]:
    """The changes of the lines text[s:e] against base[bs:be]: by tokens, or one change when the
    block is still over `TOKEN_DIFF_CHARS` once its common head and tail are set aside."""
    if (be - bs) + (e - s) > 2 * TOKEN_DIFF_CHARS:
        bs, be, s, e = _trimmed(base, text, bs, be, s, e)
    if (be - bs) + (e - s) > 2 * TOKEN_DIFF_CHARS:
        return [_named(message, base, text, bs, be, s, e)]
    return _diff(message, base, text, bs, be, s, e)


def _trimmed(base: str, text: str, bs: int, be: int, s: int, e: int) -> tuple[int, int, int, int]:
    """base[bs:be] and text[s:e] without their common head and tail, cut at whole tokens (a long
    line, such as a one-line JSON document, with one value changed)."""
    head = _shared(lambda k: base[bs:bs + k] == text[s:s + k], min(be - bs, e - s))
    head = min(_token_start(base, bs + head, bs) - bs, _token_start(text, s + head, s) - s)
    tail = _shared(lambda k: k == 0 or base[be - k:be] == text[e - k:e], min(be - bs, e - s) - head)
    tail = min(be - _token_end(base, be - tail, be), e - _token_end(text, e - tail, e))
    return bs + head, be - tail, s + head, e - tail


def _diff(message: int, base: str, text: str, bs: int, be: int, s: int, e: int) -> list[Change]:
    """The changes of text[s:e] against base[bs:be] by a token diff, spans in the whole texts."""
    old, new = _tokens(base[bs:be]), _tokens(text[s:e])
    matcher = difflib.SequenceMatcher(None, [t for t, _ in old], [t for t, _ in new], autojunk=False)
    out = []
    for i1, i2, j1, j2 in _merged(matcher.get_opcodes(), new):
        old_start = old[i1][1] if i1 < len(old) else be - bs
        old_end = old[i2 - 1][1] + len(old[i2 - 1][0]) if i2 > i1 else old_start
        new_start = new[j1][1] if j1 < len(new) else e - s
        new_end = new[j2 - 1][1] + len(new[j2 - 1][0]) if j2 > j1 else new_start
        out.append(_named(message, base, text, bs + old_start, bs + old_end, s + new_start, s + new_end))
    return out


def _named(message: int, base: str, text: str, bs: int, be: int, s: int, e: int) -> Change:
    """The change of base[bs:be] to text[s:e], named by its line's key, else quoting its lines."""
    old_value, new_value = base[bs:be], text[s:e]
    key = key_of(text, s) if "\n" not in old_value + new_value else None
    if key is not None and key == key_of(base, bs):
        return Change(message, s, e, bs, be, key, old_value, new_value)
    return Change(message, s, e, bs, be, "the line", _quoted(base, bs, be), _quoted(text, s, e),
                  old_value.strip(), new_value.strip())


def _quoted(text: str, start: int, end: int) -> str:
    """The lines that hold [start, end), quoted; a line longer than `QUOTE_CHARS` (a one-line JSON
    document) is quoted `QUOTE_AROUND` characters either side of the change, cut marked "…"."""
    a, b = _line(text, start, end)
    if b - a > QUOTE_CHARS:
        a2, b2 = max(a, start - QUOTE_AROUND), min(b, end + QUOTE_AROUND)
        return f'"{"…" if a2 > a else ""}{text[a2:b2].strip()}{"…" if b2 < b else ""}"'
    return f'"{text[a:b].strip()}"'
