"""`kvnotes sweep`: one field of a document given many values, every strategy against recompute on
each, and the sweep's statistics (`vocabulary.sweeps`) in the shape `GET /api/sweeps/{id}` gives.

    kvnotes sweep --document doc.txt --field "active" [--label status] \\
        (--values suspended,banned,… | --values-file values.txt | --generate KIND --count N …) \\
        --question "..." [--choices yes,no] [--extend-choices] [--strategies recompute,erratum,…] \\
        [--threshold 0.95] [--stop-when-decided] [--timed-edits 3] [--json]

It runs in this process, on the engine: the document is prefilled once (`document_prefills`: 1)
and every edit starts from those notes. A value equal to the old one is skipped and counted. A
values file holds one value a line (a .csv / .jsonl file: the column named by --label, or the
only column). `--generate` makes N values (`vocabulary.sweep_values`: timestamps, integers,
decimals or dates from --from to --to, or lines sampled from --lines-file with --seed). A value
the choices do not name (where they name the field's value) exits 2, unless --extend-choices adds
it. With --stop-when-decided the sweep stops after the first edit at which its policy can no longer
change (`stopped`: "decided"; else "exhausted"). The first `--timed-edits` edits (default 3) are
timed in paired rounds (the speed-ups come from them, and each checks the decision-only reference
against a true recompute); the others decide only, untimed, the reference computed exactly from
the field on. `cost` reads each edit's wall time against one prefill of the document, measured
in the same run (before the first edit and after the last).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from commands.accounts import CommandError
from vocabulary import REFERENCE, unknown_strategies, with_recompute
from vocabulary.confidence import INTERVAL_WORDS
from vocabulary.sweep_values import KINDS, GenerateError, generate_values
from vocabulary.sweeps import (
    DEFAULT_THRESHOLD,
    ORIGINAL,
    SWEEP_STRATEGIES,
    EditRecord,
    Outcome,
    standing_dict,
    strategy_dict,
    sweep_stats,
)
from vocabulary.verdicts import outside_choices

DEFAULT_TIMED_EDITS = 3  # the API's default too (`app.services.sweep_input.SweepCreate.timed_edits`)


class SweepUsageError(CommandError):
    """Bad input: `kvnotes` exits 2 with this one line."""


def _values(args) -> list[str]:
    if args.values is not None and args.values_file is not None:
        raise SweepUsageError("give the values one way: --values a,b,… or --values-file F")
    if args.values is None and args.values_file is None:
        if args.generate is None:
            raise SweepUsageError("give the values: --values a,b,…, --values-file F or --generate KIND")
        return _generated(args)
    if args.values is not None:
        values = [v.strip() for v in args.values.split(",")]
        where = "--values"
    else:
        path = Path(args.values_file)
        if not path.is_file():
            raise SweepUsageError(f"values file not found: {path}")
        text = path.read_text(encoding="utf-8")
        where = str(path)
        if path.suffix.lower() in (".csv", ".jsonl", ".ndjson"):
            values = _column(text, path.suffix.lower(), args.label or "", where)
        else:
            values = [line.strip() for line in text.splitlines() if line.strip()]
    if not values:
        raise SweepUsageError(f"{where}: the value list is empty")
    for i, value in enumerate(values, start=1):
        if not value:
            raise SweepUsageError(f"{where}: value {i} is empty")
    return values + (_generated(args) if args.generate else [])


def _generated(args) -> list[str]:
    """--generate's values (at most KVNOTES_MAX_SWEEP_EDITS)."""
    from data.settings import get_settings

    if args.count is None:
        raise SweepUsageError("--generate needs --count N")
    lines = None
    if args.lines_file is not None:
        path = Path(args.lines_file)
        if not path.is_file():
            raise SweepUsageError(f"lines file not found: {path}")
        lines = path.read_text(encoding="utf-8").splitlines()
    try:
        return generate_values(args.generate, args.count, args.start, args.end, places=args.places,
                               lines=lines, seed=args.seed, fmt=args.format,
                               limit=get_settings().max_sweep_edits)
    except GenerateError as exc:
        raise SweepUsageError(f"--generate {args.generate}: {exc}") from None


def checked_choices(values: list[str], choices: tuple[str, ...], old: str, extend: bool) -> list[str]:
    """The values to add to the choices (`--extend-choices`); without it, exit 2 naming the first
    value the choices do not name (where they name the field's old value or another value)."""
    missing = outside_choices(values, list(choices), [old, *values]) if choices else []
    if missing and not extend:
        i = values.index(missing[0]) + 1
        raise SweepUsageError(f"value {i}, {missing[0]!r}, is not among the choices ({', '.join(choices)}): "
                              "every answer is one of them, so the edit could not be scored; add it to "
                              "--choices, or pass --extend-choices")
    return missing


def _column(text: str, suffix: str, label: str, where: str) -> list[str]:
    import csv
    import io

    rows = ([json.loads(line) for line in text.splitlines() if line.strip()] if suffix != ".csv"
            else list(csv.DictReader(io.StringIO(text))))
    out = []
    for n, row in enumerate(rows, start=1):
        columns = [c for c in row if c != "expected"]
        column = label if label in columns else (columns[0] if len(columns) == 1 else None)
        if column is None:
            raise SweepUsageError(f"{where}: row {n} has no column {label!r} "
                                  f"(columns: {', '.join(columns)})")
        out.append(str(row[column] or "").strip())
    return out


def run_sweep(eng, document: str, field: str, label: str, values: list[str], question,
              strategies: list[str], threshold: float = DEFAULT_THRESHOLD, progress=None,
              stop_when_decided: bool = False, timed_edits: int = DEFAULT_TIMED_EDITS, notes=None) -> dict:
    """The sweep's result as `kvnotes sweep --json` prints it (also what the example sweep and the
    benchmark store): per-strategy statistics and standing, the policy, the frontier, every
    candidate's worst cases and each edit's decisions; the document prefilled once. With
    `stop_when_decided`, it stops after the first edit at which the policy can no longer change. The
    first `timed_edits` edits are timed in paired rounds, the rest decide only. `notes`: the
    document's notes when the caller has them (else prefilled here); a warm prefill is timed apart."""
    from worker.engine import Field, RunRequest
    from worker.engine.orders import reading_orders

    start = document.find(field)
    if start < 0:
        raise SweepUsageError(f"--field: {field!r} is not in the document")
    names = with_recompute(strategies)
    names = names if ORIGINAL in names else [*names, ORIGINAL]
    if notes is None:
        notes = eng.prefill(document)
    # the edits are read against a warm prefill: the first forward after loading also pays one-time
    # costs (a held-out run timed it at 5.8 s against 2.1 s warm), so it is not a sample
    started = time.perf_counter()
    eng.prefill(document)
    prefill_ms = [(time.perf_counter() - started) * 1e3]
    edits, skipped, checks, walls, reads, read_from = [], 0, [], [], [], {}
    stopped = "exhausted"
    for value in values:
        if value == field:
            skipped += 1
            continue
        timed = len(edits) < timed_edits
        request = RunRequest(document=document, question=question, strategies=tuple(names),
                             fields=(Field(start, start + len(field), value, label),),
                             timing=timed, check_reference=timed)
        started = time.perf_counter()
        report = eng.run(request, notes=notes)
        walls.append((time.perf_counter() - started) * 1e3)
        if report.exact_reference_kl is not None:
            checks.append(report.exact_reference_kl)
        reads.append(dict(report.orders_read))
        read_from.update(report.read_from)
        outcomes = {name: Outcome(decision=r.decision, followed=r.edit_followed, kl=r.kl_to_recompute,
                                  tokens=r.tokens_computed, prefix_cache_share=r.prefix_cache_share,
                                  ttft_ms=r.ttft_ms, speedup=r.speedup)
                    for name, r in report.strategies.items()}
        edits.append(EditRecord(position=len(edits), group=label, values={label: value}, expected=None,
                                run_id=0, outcomes=outcomes))
        if progress:
            progress(len(edits), len(values))
        if stop_when_decided and sweep_stats(edits, names, bool(question.choices), threshold).decided:
            stopped = "decided"
            break
    if not edits:
        raise SweepUsageError(f"every value ({skipped}) equals the field's old value: nothing to run")
    started = time.perf_counter()
    eng.prefill(document)  # a timing sample only: the cost of an edit is read against a prefill's
    prefill_ms.append((time.perf_counter() - started) * 1e3)
    stats = sweep_stats(edits, names, bool(question.choices), threshold)
    p = stats.policy
    standings = {st.name: st for st in p.standings}
    return {
        "status": "succeeded", "model": eng.info.alias,
        "edits_total": sum(v != field for v in values), "edits_done": len(edits),
        "stop_when_decided": stop_when_decided, "stopped": stopped,
        "timed_edits": timed_edits, "edits_timed": min(timed_edits, len(edits)),
        "exact_reference_kl": max(checks) if checks else None,
        "edits_skipped": skipped, "document_prefills": 1, "document_tokens": notes.n_tokens,
        "cost": edit_cost(walls, prefill_ms, min(timed_edits, len(edits))),
        "orders_read": orders_read(reads, len(reading_orders(question.choices)) if question.choices else 0),
        # strategies whose decision-only decisions are read off another's readout (the same notes)
        "read_from": read_from,
        "question": question.text, "choices": list(question.choices), "threshold": threshold,
        "interval": INTERVAL_WORDS,
        "strategies": {name: {**strategy_dict(s), **standing_dict(standings.get(name), threshold)}
                       for name, s in stats.strategies.items()},
        "policy": {"strategy": p.strategy, "threshold": p.threshold, "sentence": p.sentence,
                   "decided": p.decided},
        "frontier": [{"label": f.label, "agreement": f.agreement, "ci95": list(f.ci95) if f.ci95 else None,
                      "cost_share": f.cost_share, "source": f.source} for f in stats.frontier],
        "worst_cases": [{"strategy": w.strategy, "values": w.values, "answer": w.answer,
                         "recompute": w.recompute, "original": w.original, "kept": w.kept}
                        for w in stats.worst],
        "edits": [{"values": e.values, "decisions": {n: o.decision for n, o in e.outcomes.items()},
                   "edit_followed": {n: o.followed for n, o in e.outcomes.items()},
                   "tokens_computed": {n: o.tokens for n, o in e.outcomes.items()},
                   "ttft_ms": {n: o.ttft_ms for n, o in e.outcomes.items()}, "wall_ms": wall,
                   "orders_read": read}
                  for e, wall, read in zip(edits, walls, reads, strict=True)],
    }


def orders_read(reads: list[dict[str, int]], of: int) -> dict | None:
    """How many of a choice question's `of` orders the decision-only edits read (each readout stops
    once no order left could change its decision): per edit the most any of its strategies read,
    its median and maximum over the edits, and the same per strategy. None without such edits."""
    done = [r for r in reads if r]
    if not done:
        return None
    per_edit = [max(r.values()) for r in done]
    names = dict.fromkeys(n for r in done for n in r)
    return {"of": of, "edits": len(done), "median": statistics.median(per_edit), "max": max(per_edit),
            "strategies": {n: {"median": statistics.median(r[n] for r in done if n in r),
                               "max": max(r[n] for r in done if n in r)} for n in names}}


def edit_cost(walls: list[float], prefill_ms: list[float], timed: int) -> dict:
    """What an edit cost against one prefill of the document, both measured in this run: the
    document's prefill timed warm before the first edit and again after the last (timing samples, not
    used), and each edit's wall time, every strategy and the reference included. The timed edits
    (paired rounds) and the decision-only ones are summarised apart."""
    prefill = statistics.median(prefill_ms)

    def summary(part: list[float]) -> dict | None:
        if not part:
            return None
        ratios = [w / prefill for w in part]
        return {"edits": len(part), "median_ms": statistics.median(part),
                "median_prefills": statistics.median(ratios), "max_prefills": max(ratios)}

    return {"prefill_ms": prefill_ms, "timed": summary(walls[:timed]),
            "decision_only": summary(walls[timed:])}


def _document(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise SweepUsageError(f"document file not found: {path}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SweepUsageError(f"document file is not UTF-8 text: {path}") from None


def _question(args):
    from worker.engine import Question

    choices = tuple(c.strip() for c in args.choices.split(",") if c.strip()) if args.choices else ()
    if args.choices is not None and len(choices) < 2:
        raise SweepUsageError("--choices needs at least two comma-separated choices")
    return Question(args.question, choices=choices, max_new_tokens=args.max_new_tokens)


def _load(args):
    from data.settings import get_settings
    from worker.engine import load

    settings = get_settings()
    return load(args.model, device=args.device or settings.device or None,
                dtype=args.dtype or settings.dtype or None, data_dir=settings.data_dir)


def cmd_sweep(args) -> None:
    document = _document(args.document)
    question = _question(args)
    values = _values(args)
    extended = checked_choices(values, question.choices, args.field, args.extend_choices)
    if extended:
        from dataclasses import replace

        question = replace(question, choices=(*question.choices, *extended))
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()] if args.strategies \
        else list(SWEEP_STRATEGIES)
    problem = unknown_strategies(strategies)
    if problem:
        raise SweepUsageError(problem)
    if args.timed_edits < 0:
        raise SweepUsageError(f"--timed-edits must be 0 or more, got {args.timed_edits}")
    if not 0 < args.threshold < 1:
        raise SweepUsageError(f"--threshold must be between 0 and 1, got {args.threshold}")
    if args.field not in document:
        raise SweepUsageError(f"--field: {args.field!r} is not in the document")
    eng = _load(args)
    result = run_sweep(eng, document, args.field, args.label or "the value", values,
                       question, strategies, args.threshold, stop_when_decided=args.stop_when_decided,
                       timed_edits=args.timed_edits)
    result["extended_choices"] = extended
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['model']}: {result['edits_done']} of {result['edits_total']} edits "
          f"({result['edits_skipped']} skipped), document prefilled {result['document_prefills']} time")
    cost = result["cost"]
    prefill = statistics.median(cost["prefill_ms"])
    for kind, words in (("decision_only", "decision-only"), ("timed", "timed")):
        if cost[kind]:
            print(f"a {words} edit cost {cost[kind]['median_prefills']:.2f}x one prefill of the document "
                  f"(median of {cost[kind]['edits']}; a prefill took {prefill:.0f} ms in this run)")
    reads = result["orders_read"]
    if reads:
        print(f"a decision-only edit read {reads['median']:g} of the choices' {reads['of']} orders (median; "
              f"at most {reads['max']}): each readout stops once no order left could change its decision")
    if result["stopped"] == "decided":
        print(f"stopped after {result['edits_done']} edits: the policy is decided (no later edit could "
              "change it)")
    if extended:
        print(f"choices extended with {', '.join(extended)}")
    print(f"{'strategy':<14} {'agreement':>9} {'95% CI':>14} {'changed':>9} {'cost':>7}")
    for name, s in result["strategies"].items():
        ci = s["agreement_ci95"] or [0, 0]
        changed = s["changed"]
        print(f"{name:<14} {s['agreed']:>4}/{s['determined']:<4} [{ci[0]:.2f}, {ci[1]:.2f}] "
              f"{changed['agreed']:>4}/{changed['edits']:<4} {s['cost_share'] or 0:>7.1%}")
    print(f"policy: {result['policy']['strategy']} — {result['policy']['sentence']}")
    for s in result["strategies"].values():
        if s.get("needed"):
            print(f"  {s['needed_words']}")


def add_command(sub) -> None:
    from vocabulary import DEFAULT_MODEL

    p = sub.add_parser("sweep", help="many values of one field: which strategy follows recompute, "
                                     "with 95%% intervals, and the policy")
    p.add_argument("--document", required=True)
    p.add_argument("--field", required=True,
                   help="the field's current text in the document (its first occurrence)")
    p.add_argument("--label", default=None, help="the field's name (in errata and the output)")
    p.add_argument("--values", default=None, help="comma-separated new values, one edit each")
    p.add_argument("--values-file", default=None, help="one value a line (or a .csv / .jsonl column)")
    p.add_argument("--generate", default=None, choices=KINDS,
                   help="generate --count values: timestamps, integers, decimals or dates evenly spaced "
                        "from --from to --to, or lines sampled from --lines-file")
    p.add_argument("--count", type=int, default=None, help="how many values --generate makes")
    p.add_argument("--from", dest="start", default=None, help="the range's start (ISO 8601 for times)")
    p.add_argument("--to", dest="end", default=None, help="the range's end, included")
    p.add_argument("--places", type=int, default=2, help="decimal places of --generate decimals")
    p.add_argument("--lines-file", default=None, help="--generate lines: one value a line to sample")
    p.add_argument("--seed", type=int, default=0, help="--generate lines: the sample's seed")
    p.add_argument("--format", default=None, help="strftime format of generated timestamps / dates")
    p.add_argument("--extend-choices", action="store_true",
                   help="add values the choices do not name to the choices (else exit 2)")
    p.add_argument("--stop-when-decided", action="store_true",
                   help="stop as soon as the policy can no longer change (the intervals are confidence "
                        "sequences, valid at every look)")
    p.add_argument("--strategies", default=None,
                   help=f"comma-separated (default: {','.join(SWEEP_STRATEGIES)}); {REFERENCE} and "
                        f"{ORIGINAL} are always included")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="the policy's threshold on both lower bounds: agreement on every determined "
                        "edit and on the changed edits")
    p.add_argument("--timed-edits", type=int, default=DEFAULT_TIMED_EDITS, metavar="K",
                   help="time the first K edits in paired rounds (the speed-ups come from them); the rest "
                        "decide only, untimed (default %(default)s)")
    p.add_argument("--question", required=True)
    p.add_argument("--choices", default=None, help="comma-separated; without it the answer is generated")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias (see `kvnotes models`), path or hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_sweep)
