"""`kvnotes` — the command line. JSON on stdout is the contract benchmarks and later tools rely on.

    kvnotes models [--convert]    (--convert: the bundled models converted ahead, as the install does)
    kvnotes edit --model M --document doc.txt --replace OLD NEW [--label L] \\
        [--replace OLD2 NEW2 --label L2] --question "..." [--choices "yes,no"] \\
        [--strategies recompute,erratum,...] [--cot] --json
    kvnotes compose --model M --context ctx.txt --skill skill.txt [--skill s2.txt] [--at end|CHAR] \\
        [--seam K] --question "..." [--choices "..."] --json
    kvnotes attribute --model M --document doc.txt --replace OLD NEW --question "..." [--span-tokens 16]
    kvnotes serve | worker        (the web app and its Celery worker)
    kvnotes users add|list|remove, kvnotes tokens create|list|revoke   (accounts; see commands.accounts)
    kvnotes replay --url URL --document doc.txt --field OLD --values v1,v2 --question "..." --json
                                  (the edit on a vLLM server; see commands.replay, docs/serving.md)
    kvnotes sweep --document doc.txt --field OLD [--label L] (--values a,b,… | --values-file F) \\
        --question "..." [--choices …] [--strategies …] [--threshold 0.95] --json
                                  (many values of a field, the policy; see commands.sweep)
    kvnotes trajectory --document doc.txt --turns turns.jsonl [--field L=TEXT] [--strategies …] [--json]
                                  (turns appended and fields changed, each strategy carrying its cache)
    kvnotes gateway --upstream URL [--policy erratum|field_erratum|hoist|pass-through] [--notebook ID]
                    [--keys FILE]  (an OpenAI endpoint that sends field changes as errata; commands.gateway)
    kvnotes gateway keys add TENANT --keys FILE   (a new key for the gateway's key file, printed once)

Bad input exits with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


class UsageError(Exception):
    pass


def _read(path: str, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} file not found: {path}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} file is not UTF-8 text: {path}") from None


def _question(args):
    from worker.engine import Question

    choices = tuple(c.strip() for c in args.choices.split(",") if c.strip()) if args.choices else ()
    if args.choices is not None and len(choices) < 2:
        raise UsageError("--choices needs at least two comma-separated choices")
    return Question(args.question, choices=choices, cot=args.cot, max_new_tokens=args.max_new_tokens)


def _print(report, args) -> None:
    data = report.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return
    print(f"{data['model']}: {data['document_tokens']} document tokens")
    print(f"{'strategy':<14} {'decision':<18} {'KL':>9} {'top1':>5} {'top10':>5} {'tokens':>7} {'ms':>9}"
          "  speed-up")
    from vocabulary import REFERENCE

    ref = data["strategies"].get(REFERENCE)
    for name, r in data["strategies"].items():
        print(f"{name:<14} {r['decision'][:18]:<18} {r['kl_to_recompute']:>9.4f} {str(r['top1_agrees']):>5} "
              f"{r['topk_overlap']:>5} {r['tokens_computed']:>7} {r['latency_ms']:>9.1f}  "
              f"{_speedup_text(r, ref) if name != REFERENCE else ''}")


def _speedup_text(r: dict, ref: dict | None) -> str:
    """The speed-up as the run page reads it: "6.9× (5.1–8.0×)", or why it does not stand."""
    from vocabulary.speedups import speedup_reading

    if ref is None or r.get("speedup") is None:
        return "-"
    reading = speedup_reading(ref.get("ttft_ms"), r.get("ttft_ms"), r.get("speedup_range"),
                              ref.get("ttft_spread_ms"), r.get("ttft_spread_ms"))
    if reading is not None:
        return reading.label
    span = r.get("speedup_range") or []
    return f"{r['speedup']:.1f}×" + (f" ({span[0]:.1f}–{span[1]:.1f}×)" if len(span) == 2 else "")


def _load(args):
    """The engine for `--model` on `--device` in `--dtype` (else `KVNOTES_DEVICE` / `KVNOTES_DTYPE`),
    converting bundled models under the settings' data folder (`KVNOTES_DATA`)."""
    from data.settings import get_settings
    from worker.engine import load
    from worker.engine.devices import parse_max_memory

    settings = get_settings()
    store = None
    if getattr(args, "store", None) or settings.store_url:  # the KV store, with its shared tier (issue 40)
        from worker.runtime import open_store

        store = open_store(getattr(args, "store", None) or "")
    return load(args.model, device=args.device or settings.device or None,
                dtype=args.dtype or settings.dtype or None, data_dir=settings.data_dir,
                max_memory=parse_max_memory(args.max_memory or settings.max_memory), store=store)


def cmd_models(args) -> None:
    from data.settings import get_settings
    from worker.engine.models import list_models

    if args.convert:
        _convert_bundled(get_settings().data_dir)
    rows = [m.__dict__ for m in list_models(get_settings().data_dir)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for m in rows:
            print(f"{m['alias']:<16} {m['family']:<10} "
                  f"{'chat' if m['chat'] else 'base':<5} {m['description']}")


def _convert_bundled(data_dir: Path) -> None:
    """Convert every bundled model not yet converted under `data_dir` (the install does this, so a
    first run never waits minutes), telling stderr "converting gemma3-270m (first use): k of n
    tensors" as it goes."""
    from worker.engine.models import REAL_MODELS, conversion_stage, ensure_converted, needs_conversion
    from worker.runtime import converting

    def say(stage: str) -> None:
        print(stage, file=sys.stderr, flush=True)

    for alias in REAL_MODELS:
        if needs_conversion(alias, data_dir):
            say(conversion_stage(alias))
            ensure_converted(alias, data_dir, converting(alias, say, step=0.1))


def cmd_edit(args) -> None:
    document = _read(args.document, "document")
    fields = _fields(document, args.replace, args.label)
    strategies = _names(args.strategies)
    eng = _load(args)
    kw = {"strategies": strategies} if strategies else {}
    if args.erratum_template:
        kw["erratum_template"] = args.erratum_template
    report = eng.edit(document, fields, _question(args), selective_fraction=args.selective,
                      attribution=args.attribution, mechanism=args.mechanism, **kw)
    _print(report, args)
    if report.mechanism is not None and not args.json:
        _print_mechanism(report.mechanism)


def _print_mechanism(m) -> None:
    """The mechanism views in a few lines: knockout rows beside their controls, K* per ranking,
    and where the logit lens puts recompute's answer token at the last layer."""
    print(f"mechanism: recompute's answer token {m.answer!r}, decision {m.decision!r}; cost in recomputes: "
          + ", ".join(f"{k} {v:.2f}" for k, v in m.costs.items()))
    for row in m.knockout:
        if row.reading is None:
            print(f"  knockout {row.strategy:<13} {row.region:<17} {row.layers:<6} {row.note}")
            continue
        c = row.control
        print(f"  knockout {row.strategy:<13} {row.region:<17} {row.layers:<6} {row.size:>4} tokens: "
              f"{row.reading.decision[:12]!r} p {row.reading.p_answer:.3f} KL {row.reading.kl:.4f} | control "
              f"p {c.p_answer:.3f}±{c.p_answer_spread:.3f} KL {c.kl:.4f}")
    if m.selective_skipped:
        print(f"  selective@K skipped: {m.selective_skipped}")
    for curve in m.selective_k:
        star = curve.note or (f"K* = {curve.k_star}" if curve.k_star is not None else "no K restores it")
        print(f"  selective@K {curve.ranking:<13} {star}")
    for name, ps in m.logit_lens.items():
        print(f"  lens {name:<13} p(answer) last layer {ps[-1]:.3f}, highest {max(ps):.3f} at layer "
              f"{ps.index(max(ps)) + 1}")
    for line in m.notes:
        print(f"  note: {line}")


def cmd_compose(args) -> None:
    from vocabulary import DEFAULT_COMPOSE_STRATEGIES

    context = _read(args.context, "context")
    skills = [_read(s, "skill") for s in args.skill]
    at = None
    if args.at not in (None, "end"):
        try:
            at = int(args.at)
        except ValueError:
            raise UsageError(f"--at must be 'end' or a character offset, not {args.at!r}") from None
    strategies = _names(args.strategies) or list(DEFAULT_COMPOSE_STRATEGIES)
    eng = _load(args)
    report = eng.compose(context, skills, _question(args), at=at, seam=args.seam, strategies=strategies)
    _print(report, args)


def cmd_attribute(args) -> None:
    from worker.engine.attribution import attribute

    document = _read(args.document, "document")
    fields = _fields(document, args.replace)
    result = attribute(_load(args), document, fields, _question(args),
                       span_tokens=args.span_tokens, coarse=args.coarse)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    whose = "the field's" if len(fields) == 1 else "the fields'"
    print(f"KL stale {result.kl_stale:.4f} → in_place {result.kl_in_place:.4f}: "
          f"{whose} own K/V closes {result.field_share:.0%} of the gap")
    if len(result.edits) > 1:
        for e in result.edits:
            print(f"  alone, {document[e.start_char:e.end_char]!r} closes {e.share:.0%} of the gap")
    print("each share is that patch alone (they do not add up); a span's is of the gap in_place leaves:")
    for s in result.spans:
        print(f"  tokens {s.start:>5}-{s.end:<5} {s.share:>7.1%}  {s.text!r}")


def _names(value: str | None) -> list[str]:
    """The strategies a comma-separated option names ([] when it was not given)."""
    return [s.strip() for s in value.split(",") if s.strip()] if value else []


def _strategy_help(infos, default: str) -> str:
    """`--strategies` help from the vocabulary's descriptors: every name and what it recomputes."""
    names = "; ".join(f"{info.name}: {info.recomputes}" for info in infos.values())
    return f"comma-separated (default: {default}). {names}"


# a field's name when --label gives none: the one `kvnotes sweep` uses, so both write the same erratum
UNLABELLED = "the value"


def _fields(document: str, replaces, labels: list[str] | None = None) -> list:
    """One field per --replace OLD NEW, named by its --label (one per --replace, in order; none:
    `UNLABELLED`, as a sweep names an unlabelled field), so `kvnotes edit --label destination`
    writes the erratum a sweep on that field writes."""
    from worker.engine import Field

    replaces, labels = replaces or [], labels or []
    if labels and len(labels) != len(replaces):
        raise UsageError(f"--label: give one per --replace ({len(replaces)} --replace, "
                         f"{len(labels)} --label)")
    fields = []
    for i, (old, new) in enumerate(replaces):
        start = document.find(old)
        if start < 0:
            raise UsageError(f"--replace: {old!r} is not in the document")
        fields.append(Field(start, start + len(old), new, label=labels[i] if labels else UNLABELLED))
    if not fields:
        raise UsageError("at least one --replace OLD NEW is needed")
    return fields


def _store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, metavar="s3://BUCKET/PREFIX",
                   help="read and keep notes in the KV store under KVNOTES_DATA with this shared tier behind "
                        "it (default: KVNOTES_STORE_URL; unset: no store)")


def _common(p: argparse.ArgumentParser) -> None:
    from vocabulary import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="alias (see `kvnotes models`), local path or hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, auto … (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: KVNOTES_DTYPE, else bfloat16 on CUDA and float32 on the CPU")
    p.add_argument("--max-memory", default=None, metavar="0=70GiB,cpu=200GiB",
                   help="with --device auto: what each device may hold (default: KVNOTES_MAX_MEMORY)")
    p.add_argument("--question", required=True)
    p.add_argument("--choices", default=None, help="comma-separated; without it the decision is generated")
    p.add_argument("--cot", action="store_true", help="chain of thought: generate, then answer")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def build_parser() -> argparse.ArgumentParser:
    from vocabulary import COMPOSE_INFO, DEFAULT_COMPOSE_STRATEGIES, EDIT_INFO

    parser = argparse.ArgumentParser(
        prog="kvnotes", description="Edit and compose a language model's notes (KV cache)."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the models that can be loaded")
    p.add_argument("--json", action="store_true")
    p.add_argument("--convert", action="store_true",
                   help="first convert every bundled model not yet converted under KVNOTES_DATA "
                        "(minutes, once; the install does it)")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("edit", help="edit fields of a document with every strategy, against recompute")
    p.add_argument("--document", required=True)
    p.add_argument("--replace", nargs=2, action="append", metavar=("OLD", "NEW"),
                   help="replace the first occurrence of OLD by NEW (repeatable)")
    p.add_argument("--label", action="append", default=None, metavar="NAME",
                   help="the field's name in its erratum, one per --replace in order (repeatable; default "
                        f"{UNLABELLED!r}, as `kvnotes sweep` names an unlabelled field)")
    p.add_argument("--strategies", default=None, help=_strategy_help(EDIT_INFO, "all"))
    p.add_argument("--selective", type=float, default=0.15,
                   help="fraction of downstream tokens for `selective`")
    p.add_argument("--erratum-template", default=None, help="format string with {label}, {old}, {new}")
    p.add_argument("--attribution", action="store_true", help="also map which notes carry the decision")
    p.add_argument("--mechanism", action="store_true",
                   help="also knockout, selective@K with K*, and a logit lens per strategy")
    _common(p)
    _store_option(p)
    p.set_defaults(func=cmd_edit)

    p = sub.add_parser("compose", help="splice compiled skills into a context, against recompute")
    p.add_argument("--context", required=True)
    p.add_argument("--skill", action="append", required=True, help="a skill text file (repeatable)")
    p.add_argument("--at", default="end", help="'end' or a character offset in the context")
    p.add_argument("--seam", type=int, default=0,
                   help="recompute the first K skill tokens with the real prefix")
    p.add_argument("--strategies", default=None,
                   help=_strategy_help(COMPOSE_INFO, ",".join(DEFAULT_COMPOSE_STRATEGIES)))
    _common(p)
    _store_option(p)
    p.set_defaults(func=cmd_compose)

    p = sub.add_parser("attribute", help="which notes carry the decision: patch spans from recompute")
    p.add_argument("--document", required=True)
    p.add_argument("--replace", nargs=2, action="append", metavar=("OLD", "NEW"))
    p.add_argument("--span-tokens", type=int, default=16, help="tokens per patched span where it matters")
    p.add_argument("--coarse", type=int, default=4,
                   help="first pass in spans of COARSE × span tokens (1: every span)")
    _common(p)
    p.set_defaults(func=cmd_attribute)

    try:
        from commands.serve import add_commands
    except ImportError:  # the web part is optional for engine-only installs
        pass
    else:
        add_commands(sub)
        from commands.accounts import add_commands as add_account_commands

        add_account_commands(sub)
    from commands.replay import add_command as add_replay_command

    add_replay_command(sub)
    from commands.sweep import add_command as add_sweep_command

    add_sweep_command(sub)
    from commands.trajectory import add_command as add_trajectory_command

    add_trajectory_command(sub)
    from commands.gateway import add_command as add_gateway_command

    add_gateway_command(sub)
    from commands.store import add_command as add_store_command

    add_store_command(sub)
    return parser


def quiet_idle_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine, spinning threads of
    two processes made a 28-token forward take 5.5 s instead of 0.27 s (docs/benchmarks.md). It must
    be set before torch loads; child processes (the supervised Celery worker) inherit it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    quiet_idle_threads()
    from data.logs import configure_logging

    configure_logging(logging.WARNING)  # key=value lines, extra fields included (data.logs)
    args = build_parser().parse_args(argv)
    from pydantic import ValidationError

    from commands.accounts import CommandError
    from worker.engine.types import EngineError

    try:
        result = args.func(args)
    except (UsageError, EngineError, CommandError) as exc:
        print(f"kvnotes: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # a setting in the environment, e.g. KVNOTES_DTYPE=fp8
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"kvnotes: bad setting: {wrong}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
