"""`kvnotes trajectory`: a document and turns (JSONL, one turn a line), every strategy carrying its
own cache from turn to turn, in the shape `GET /api/trajectories/{id}` gives.

    kvnotes trajectory --document doc.txt --turns turns.jsonl [--field status=active …] \\
        --question "..." [--choices yes,no] [--strategies recompute,erratum,hoist,auto,…] \\
        [--skill refunds=refunds.txt …] [--policy erratum] [--json]

A line of the turns file: {"append": "...", "fields": {"status": "suspended"}, "question": "...",
"choices": ["yes", "no"], "skill": "refunds"}, each key optional (but not all). A field a turn
changes is found in the document as `--field LABEL=TEXT` says (TEXT's first occurrence), or else as
the text after "LABEL: " up to the end of its line or sentence. A skill a turn places is a text
file given as `--skill NAME=FILE` (compiled once, before the turns). `auto` applies `--policy` (a
notebook's adopted sweep policy: the strategy it names) and is refused without one. It runs in this
process, on the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from commands.accounts import CommandError
from vocabulary import REFERENCE
from vocabulary.trajectories import (
    FieldSpec,
    SkillSpec,
    TrajectorySpec,
    TurnSpec,
    accepted,
    carried,
    composite,
    summaries,
    turns_from_jsonl,
    unknown_keys,
    verdict,
    with_reference,
)


class TrajectoryUsageError(CommandError):
    """Bad input: `kvnotes` exits 2 with this one line."""


def _read(path: str, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise TrajectoryUsageError(f"{what} file not found: {path}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TrajectoryUsageError(f"{what} file is not UTF-8 text: {path}") from None


def read_turns(text: str, where: str) -> list[TurnSpec]:
    """The turns of a JSONL text, one a line; a bad line is named by its number."""
    try:
        return turns_from_jsonl(text)
    except ValueError as exc:
        raise TrajectoryUsageError(f"{where}: {exc}") from None


def find_fields(document: str, given: list[str], labels: list[str]) -> tuple[FieldSpec, ...]:
    """The fields: `LABEL=TEXT` (TEXT's first occurrence) for each given, else "LABEL: value" found
    in the document for each label the turns change."""
    out: dict[str, FieldSpec] = {}
    for item in given:
        label, sep, text = item.partition("=")
        if not sep or not label.strip() or not text:
            raise TrajectoryUsageError(f"--field {item!r}: write LABEL=TEXT, e.g. status=active")
        start = document.find(text)
        if start < 0:
            raise TrajectoryUsageError(f"--field {label}: {text!r} is not in the document")
        out[label.strip()] = FieldSpec(label.strip(), start, start + len(text))
    for label in labels:
        if label in out:
            continue
        found = re.search(rf"{re.escape(label)}\s*:\s*([^\n.;,]+)", document)
        if found is None:
            raise TrajectoryUsageError(f"a turn changes {label!r}, which the document does not show as "
                                       f"'{label}: value'; name it with --field {label}=TEXT")
        out[label] = FieldSpec(label, found.start(1), found.end(1))
    return tuple(sorted(out.values(), key=lambda f: f.start))


def read_skills(given: list[str], turns: list[TurnSpec]) -> tuple[SkillSpec, ...]:
    """The skills `--skill NAME=FILE` gives; a turn placing a skill not given is named."""
    skills: dict[str, SkillSpec] = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path:
            raise TrajectoryUsageError(f"--skill {item!r}: write NAME=FILE, e.g. refunds=refunds.txt")
        text = _read(path, f"skill {name.strip()!r}")
        if not text.strip():
            raise TrajectoryUsageError(f"--skill {name.strip()}: {path} is empty")
        skills[name.strip()] = SkillSpec(name.strip(), text)
    for i, turn in enumerate(turns, 1):
        if turn.skill is not None and turn.skill not in skills:
            raise TrajectoryUsageError(f"turn {i} places a skill {turn.skill!r} that no --skill gives "
                                       f"(given: {', '.join(skills) or 'none'}); add --skill "
                                       f"{turn.skill}=FILE")
    return tuple(skills.values())


def result_dict(model: str, turns, status: str = "succeeded") -> dict:
    """The API's shape: status, turns with each strategy's results, the summary and the verdicts."""
    summary = summaries(turns)
    return {"model": model, "status": status, "turns": [asdict(t) for t in turns],
            "summary": {k: asdict(s) for k, s in summary.items()},
            "verdicts": {k: verdict(k, s) for k, s in summary.items() if k != REFERENCE}}


def cmd_trajectory(args) -> None:
    from commands.sweep import _load

    document = _read(args.document, "document")
    turns = read_turns(_read(args.turns, "turns"), args.turns)
    keys = [s.strip() for s in args.strategies.split(",") if s.strip()] if args.strategies \
        else list(carried())
    problem = unknown_keys(keys)
    if problem:
        raise TrajectoryUsageError(problem)
    auto = composite()
    if args.policy is not None and (args.policy not in carried()):
        raise TrajectoryUsageError(f"--policy {args.policy!r}: name a strategy ({', '.join(carried())})")
    if args.policy is None and any(k.partition(".")[0] == auto for k in keys):
        raise TrajectoryUsageError(f"{auto} in a trajectory applies an adopted sweep policy: give it as "
                                   f"--policy NAME (e.g. --policy erratum), or leave {auto} out")
    skills = read_skills(args.skill, turns)
    choices = tuple(c.strip() for c in args.choices.split(",") if c.strip()) if args.choices else ()
    labels = list(dict.fromkeys(label for t in turns for label in t.fields))
    fields = find_fields(document, args.field, labels)
    spec = TrajectorySpec(model=args.model, document=document, fields=fields, turns=tuple(turns),
                          question=args.question or "", choices=choices,
                          strategies=with_reference(keys), skills=skills, policy=args.policy)
    from worker.engine.trajectory import request_of, trajectory

    eng = _load(args)
    report = trajectory(eng, request_of(spec))
    result = result_dict(report.model, report.turns)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{report.model}: {len(report.turns)} turns, document {report.document_tokens} tokens")
    print(f"{'strategy':<30} {'agreed':>7} {'max KL':>9} {'cum. TTFT ms':>13} {'speed-up':>9} {'tokens':>8}")
    for k, s in result["summary"].items():
        speed = f"{s['cumulative_speedup']:.2f}x" if s["cumulative_speedup"] else "-"
        print(f"{k:<30} {s['agreed']:>3}/{s['turns']:<3} {s['max_kl']:>9.3g} "
              f"{s['cumulative_ttft_ms']:>13.0f} {speed:>9} {s['cumulative_tokens']:>8}")
    for sentence in result["verdicts"].values():
        print(sentence)
    if any(k.partition(".")[0] == auto for k in keys):
        print(f"{auto} applied the adopted policy: {args.policy}, at its cost")
    for turn, spec_turn in zip(report.turns, turns):
        spliced = max((r.tokens_spliced for r in turn.results.values()), default=0)
        if spec_turn.skill is not None:
            print(f"turn {turn.index + 1} placed the skill {spec_turn.skill!r}: {spliced} tokens spliced by "
                  "the strategies that are not exact (none computed; their keys re-rotated), prefilled by "
                  "the exact ones")


def add_command(sub) -> None:
    from vocabulary import DEFAULT_MODEL

    p = sub.add_parser("trajectory", help="turns appended and fields changed: each strategy carries its "
                                          "cache forward; drift and cumulative TTFT against recompute")
    p.add_argument("--document", required=True)
    p.add_argument("--turns", required=True, help="JSONL, one turn a line: append, fields, question, choices")
    p.add_argument("--field", action="append", default=[],
                   help="LABEL=TEXT: the field LABEL is TEXT's first occurrence (repeatable)")
    p.add_argument("--strategies", default=None,
                   help=f"comma-separated, of {','.join(accepted())} (default: every one but "
                        f"{composite()}); name.one_per_field keeps one erratum per field")
    p.add_argument("--skill", action="append", default=[],
                   help="NAME=FILE: the skill a turn's \"skill\": NAME places (repeatable)")
    p.add_argument("--policy", default=None,
                   help=f"the strategy {composite()} applies (a notebook's adopted sweep policy)")
    p.add_argument("--question", default=None, help="asked at every turn that asks none")
    p.add_argument("--choices", default=None, help="comma-separated; without it the answer is generated")
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias (see `kvnotes models`), path or hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_trajectory)
