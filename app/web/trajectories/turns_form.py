"""The Turns panel's editor, kept on the server: the turns as the form holds them, one row per turn
(what it appends, a value per field label of the notebook, empty meaning unchanged, an optional
question with its choices, and a skill placed where the API takes one), the editing actions (add a
turn, move one up or down, delete one, import JSONL pasted or uploaded, show the JSONL Start will
send) and the turns a trajectory starts with.

The form is the editor's only state: every action posts it whole and gets the panel back, drawn
from these rows (`apply`), so nothing typed is lost between actions and the rows are read one way
whichever button was pressed. Form names: `turn_count`, then per turn i (0-based)
`turns.{i}.append`, `turns.{i}.fields.{label}`, `turns.{i}.question`, `turns.{i}.choices` (comma
separated, as the panel's other choices) and `turns.{i}.skill`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.services.errors import Unprocessable
from vocabulary.trajectories import TurnSpec, turns_from_jsonl

PREFIX = "turns."
MAX_ROWS = 256  # the most rows one form is read with (the API's body takes as many)


@dataclass
class TurnRow:
    """One turn as the editor shows it."""

    append: str = ""
    fields: dict[str, str] = field(default_factory=dict)  # label -> value ("" = unchanged)
    question: str = ""
    choices: str = ""  # comma separated
    skill: str = ""

    def spec(self) -> TurnSpec:
        """The turn as written to the API: only the fields given, no question when blank (the
        trajectory's), no choices when none are given (a question of its own: a free answer)."""
        choices = [c.strip() for c in self.choices.split(",") if c.strip()]
        kwargs = {"skill": self.skill} if self.skill else {}
        return TurnSpec(append=self.append, fields={k: v for k, v in self.fields.items() if v != ""},
                        question=self.question if self.question.strip() else None,
                        choices=tuple(choices) if choices else None, **kwargs)

    def body(self) -> dict:
        """The turn as one JSONL line / one item of the API's `turns`: only the keys it sets."""
        spec = self.spec()
        out: dict = {}
        if spec.append:
            out["append"] = spec.append
        if spec.fields:
            out["fields"] = dict(spec.fields)
        if spec.question is not None:
            out["question"] = spec.question
        if spec.choices is not None:
            out["choices"] = list(spec.choices)
        if getattr(spec, "skill", None):
            out["skill"] = spec.skill
        return out


def _text(data: Mapping, name: str) -> str:
    """A posted value, its line ends as typed: a browser sends a textarea's lines ended by CR LF,
    and a turn's text is prefilled as written, so they are read back as LF."""
    value = data.get(name)
    return value.replace("\r\n", "\n") if isinstance(value, str) else ""


def rows_from_form(data: Mapping, labels: Sequence[str]) -> list[TurnRow]:
    """The editor's rows as posted (`turn_count` of them; a label the notebook no longer has is kept,
    so the check names it)."""
    try:
        count = min(max(int(_text(data, "turn_count") or 0), 0), MAX_ROWS)
    except ValueError:
        count = 0
    rows = []
    for i in range(count):
        stem = f"{PREFIX}{i}."
        fields = {label: _text(data, f"{stem}fields.{label}") for label in labels}
        for key in data:
            if key.startswith(f"{stem}fields.") and key[len(f"{stem}fields."):] not in fields:
                fields[key[len(f"{stem}fields."):]] = _text(data, key)
        rows.append(TurnRow(append=_text(data, f"{stem}append"), fields=fields,
                            question=_text(data, f"{stem}question"), choices=_text(data, f"{stem}choices"),
                            skill=_text(data, f"{stem}skill")))
    return rows


def rows_from_jsonl(text: str, labels: Sequence[str]) -> list[TurnRow]:
    """The rows of a JSONL text (one turn a line, `vocabulary.trajectories.turns_from_jsonl`);
    `Unprocessable` on "import" naming the line or the turn when one cannot be shown in the editor:
    a field the notebook does not have, a field set to empty text (the editor reads empty as
    unchanged), a choice holding a comma."""
    try:
        turns = turns_from_jsonl(text)
    except ValueError as exc:
        raise Unprocessable("import", f"import: {exc}") from None
    rows = []
    for n, turn in enumerate(turns, start=1):
        for label, value in turn.fields.items():
            if label not in labels:
                raise Unprocessable("import", f"turn {n}: field {label!r} does not exist in this notebook "
                                              f"(fields: {', '.join(labels) or 'none'})")
            if value == "":
                raise Unprocessable("import", f"turn {n}: field {label!r} is set to empty text, which the "
                                              "editor reads as unchanged")
        if any("," in c for c in turn.choices or ()):
            raise Unprocessable("import", f"turn {n}: a choice holds a comma; the editor separates "
                                          "choices by commas")
        rows.append(row_of(turn, labels))
    return rows


def row_of(turn: TurnSpec, labels: Sequence[str]) -> TurnRow:
    """The editor's row of a turn as written."""
    return TurnRow(append=turn.append, fields={label: turn.fields.get(label, "") for label in labels},
                   question=turn.question or "", choices=", ".join(turn.choices or ()),
                   skill=getattr(turn, "skill", None) or "")


def jsonl_of(rows: Sequence[TurnRow]) -> str:
    """The turns as JSONL, one a line: what Start sends."""
    return "".join(json.dumps(row.body(), ensure_ascii=False) + "\n" for row in rows)


@dataclass
class Edited:
    """The rows after an action, where the focus goes (a form name), and a message for the panel."""

    rows: list[TurnRow]
    focus: str = ""
    notice: str = ""
    show_jsonl: bool = False


def apply(op: str, rows: list[TurnRow], labels: Sequence[str], imported: str = "") -> Edited:
    """Do the editing action `op` ("add", "up:i", "down:i", "delete:i", "import", "export") on
    `rows`; `Unprocessable` naming the problem (the rows are left as they were)."""
    verb, _, where = op.partition(":")
    if verb == "add":
        rows = [*rows, TurnRow(fields=dict.fromkeys(labels, ""))]
        return Edited(rows, focus=f"{PREFIX}{len(rows) - 1}.append")
    if verb == "import":
        if not imported.strip():
            raise Unprocessable("import", "import: paste JSONL or choose a file first")
        found = rows_from_jsonl(imported, labels)
        turns = f"{len(found)} turn{'' if len(found) == 1 else 's'}"
        return Edited(found, notice=f"Imported {turns}; they replace the turns that were here.",
                      show_jsonl=True)
    if verb == "export":
        return Edited(rows, show_jsonl=True)
    try:
        i = int(where)
    except ValueError:
        raise Unprocessable("form", f"unknown action {op!r}") from None
    if not 0 <= i < len(rows):
        raise Unprocessable("form", f"there is no turn {i + 1}")
    if verb == "delete":
        rows = rows[:i] + rows[i + 1:]
        return Edited(rows, focus="add" if not rows else f"{PREFIX}{min(i, len(rows) - 1)}.append",
                      notice=f"Turn {i + 1} deleted.")
    if verb in ("up", "down"):
        j = i - 1 if verb == "up" else i + 1
        if 0 <= j < len(rows):
            rows = list(rows)
            rows[i], rows[j] = rows[j], rows[i]
        else:
            j = i
        if len(rows) == 1:
            return Edited(rows, focus=f"{PREFIX}0.append")
        if verb == "up" and j == 0:  # its up button is disabled now: keep the focus on the row
            verb = "down"
        elif verb == "down" and j == len(rows) - 1:
            verb = "up"
        return Edited(rows, focus=f"{verb}:{j}")
    raise Unprocessable("form", f"unknown action {op!r}")


def values_as_of(rows: Sequence[TurnRow], document: dict[str, str]) -> list[dict[str, str]]:
    """Each row's field values as it starts: the document's (`document`, label -> value), then
    every earlier row's non-empty values applied in order (a turn's label reads what the turn changes)."""
    values, out = dict(document), []
    for row in rows:
        out.append(dict(values))
        values.update({label: value for label, value in row.fields.items() if value})
    return out
