"""`kvnotes replay`: the serving replay against a running vLLM server, from the command line.

    kvnotes replay --url http://127.0.0.1:8100/v1 --document log.txt --field Oslo \\
        --values Madrid,Rome,Lisbon --question "Where does it go?" [--choices Oslo,Madrid,...] \\
        [--label destination] [--requests N] [--rate R] [--concurrency C] \\
        [--variants in_place,erratum,hoist] [--json]

    kvnotes replay --url http://127.0.0.1:8100/v1 --document record.txt --turns turns.jsonl \
        [--field status=active …] [--question "May Dana log in now?"] [--choices yes,no] \
        [--variants in_place,erratum,hoist] [--json]

With `--turns` it replays a trajectory (`serving.trajectory`): the turns of the JSONL file (as
`kvnotes trajectory` reads them), one request per turn in order, per variant; the fields a turn
changes are found as `kvnotes trajectory` finds them (`--field LABEL=TEXT`, else "LABEL: value" in
the document). It prints each variant's hit rate and TTFT per turn, and over the turns.

`--url` and `--model` default to `KVNOTES_VLLM_URL` and `KVNOTES_VLLM_MODEL`; each answer may take
`KVNOTES_REPLAY_REQUEST_TIMEOUT` seconds (120). Bad input and a replay that fails (server
unreachable, model not served, prompt too long, a request that died) exit with status 2 and one
line on stderr naming the problem (and the turn); a server that answered wrong is quoted (its HTTP
status and the first 200 characters of its body, or the exception), as the web never does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from serving import VARIANTS, Bounds, ReplayError, ReplaySpec, TrajectoryReplaySpec, replay, replay_trajectory
from serving.streams import field_label
from vocabulary.trajectories import turns_from_jsonl


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def spec_from_args(args: argparse.Namespace, document: str) -> ReplaySpec:
    """The replay the arguments describe; ReplayError when the field is not in the document."""
    if len(args.field) != 1 or not args.values or not args.question:
        raise ReplayError("a field edit's replay needs --field (the field's text, once), --values and "
                          "--question; a trajectory's needs --turns")
    text = args.field[0]
    start = document.find(text)
    if not text or start < 0:
        raise ReplayError(f"--field: {text!r} is not in the document")
    end = start + len(text)
    choices = _csv(args.choices)
    if args.choices is not None and len(choices) < 2:
        raise ReplayError("--choices needs at least two comma-separated choices")
    return ReplaySpec(document, start, end, args.label or field_label(document, start), _csv(args.values),
                      args.question, choices, requests=args.requests, rate=args.rate,
                      concurrency=args.concurrency, variants=_csv(args.variants), max_tokens=args.max_tokens,
                      seed=args.seed)


def trajectory_from_args(args: argparse.Namespace, document: str) -> TrajectoryReplaySpec:
    """The trajectory replay the arguments describe; ReplayError naming the line or the turn."""
    from commands.trajectory import TrajectoryUsageError, find_fields

    if args.values:
        raise ReplayError("--values is for a field edit's replay; with --turns the turns set the fields")
    path = Path(args.turns)
    if not path.is_file():
        raise ReplayError(f"turns file not found: {args.turns}")
    try:
        turns = turns_from_jsonl(path.read_text(encoding="utf-8"))
        fields = find_fields(document, args.field, list(dict.fromkeys(k for t in turns for k in t.fields)))
    except (ValueError, UnicodeDecodeError, TrajectoryUsageError) as exc:
        raise ReplayError(f"{args.turns}: {exc}") from None
    choices = _csv(args.choices)
    spec = TrajectoryReplaySpec(document, fields, tuple(turns), args.question or "", choices,
                                variants=_csv(args.variants), max_tokens=args.max_tokens)
    problems = spec.problems()
    if problems:
        raise ReplayError(f"{args.turns}: {'; '.join(problems)}")
    return spec


def _print_turns(data: dict) -> None:
    print(f"{data['model']} at {data['url']}: {data['prompt_format']} prompts, one request per turn, "
          f"load average {data['load_average']}")
    variants = data["variants"]
    print(f"{'variant':<10} {'turns':>5} {'hit rate':>8} {'cum. TTFT ms':>13} {'prompt':>7} {'cached':>7} "
          f"{'followed':>9}")
    for name, v in variants.items():
        print(f"{name:<10} {len(v['turns']):>5} {v['hit_rate']:>8.1%} {v['cumulative_ttft_ms']:>13.1f} "
              f"{v['prompt_tokens']:>7} {v['cached_tokens']:>7} {v['followed']:>4}/{v['moved_turns']:<4}")
    print("turn  " + "".join(f"{name + ' hit / TTFT ms':>28}" for name in variants))
    for i, turn in enumerate(next(iter(variants.values()))["turns"]):
        cells = [f"{v['turns'][i]['hit_rate']:>10.1%} / {v['turns'][i]['ttft_ms']:>9.1f}"
                 for v in variants.values()]
        changed = f"  changed {', '.join(turn['changed'])}" if turn["changed"] else ""
        print(f"{i + 1:>4}  " + "".join(f"{c:>28}" for c in cells) + changed)


def _print_table(data: dict) -> None:
    print(f"{data['model']} at {data['url']}: {data['prompt_format']} prompts, rate {data['rate']}/s, "
          f"concurrency {data['concurrency']}, load average {data['load_average']}")
    print(f"{'variant':<10} {'requests':>8} {'hit rate':>8} {'estimate':>8} {'TTFT p50':>10} {'p90 ms':>10} "
          f"{'req/s':>7} {'tokens':>7} {'agree':>6}")
    for name, v in data["variants"].items():
        print(f"{name:<10} {v['requests']:>8} {v['prefix_hit_rate']:>8.1%} "
              f"{v['estimated_prefix_share']:>8.1%} {v['ttft_p50_ms']:>10.1f} {v['ttft_p90_ms']:>10.1f} "
              f"{v['throughput_rps']:>7.3f} {v['prompt_tokens']:>7} {v['agreement']:>6.0%}")


def cmd_replay(args: argparse.Namespace) -> int:
    from data.settings import get_settings

    settings = get_settings()
    url, model = args.url or settings.vllm_url, args.model or settings.vllm_model or None
    try:
        if not url:
            raise ReplayError("--url is needed (or KVNOTES_VLLM_URL): the vLLM server, e.g. from "
                              "scripts/vllm.sh")
        path = Path(args.document)
        if not path.is_file():
            raise ReplayError(f"document file not found: {args.document}")
        document = path.read_text(encoding="utf-8")
        progress = None if args.json else _progress
        # the operator's own server: a failure quotes what it answered
        bounds = Bounds(request_s=settings.replay_request_s, quote=True)
        if args.turns:
            result = replay_trajectory(trajectory_from_args(args, document), url, model, on_progress=progress,
                                       bounds=bounds)
        else:
            result = replay(spec_from_args(args, document), url, model, on_progress=progress, bounds=bounds)
    except ReplayError as exc:
        print(f"kvnotes: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif args.turns:
        _print_turns(result.to_dict())
    else:
        _print_table(result.to_dict())
    return 0


def _progress(done: int, total: int, variant: str) -> None:
    print(f"\r{variant}: {done}/{total} requests", end="\n" if done == total else "", file=sys.stderr,
          flush=True)


def add_command(sub) -> None:
    """Register `kvnotes replay` on the launcher's subparsers."""
    p = sub.add_parser("replay", help="replay field edits (or a trajectory's turns) on a vLLM server: "
                                      "in place, erratum, hoist")
    p.add_argument("--url", default="", help="the server, e.g. http://127.0.0.1:8100/v1 (KVNOTES_VLLM_URL)")
    p.add_argument("--model", default="", help="the served model name (default: the one it serves)")
    p.add_argument("--document", required=True, help="a UTF-8 text file")
    p.add_argument("--field", action="append", default=[],
                   help="the field's text in the document (its first occurrence); with --turns, LABEL=TEXT "
                        "(repeatable)")
    p.add_argument("--turns", default="", help="a trajectory: JSONL, one turn a line (append, fields, "
                                                "question, choices), replayed one request per turn")
    p.add_argument("--label", default="", help="the field's name in the erratum (default: the word before "
                                                 "a colon on its line, else 'the value')")
    p.add_argument("--values", default="", help="comma-separated values the field takes, one per request")
    p.add_argument("--question", default="", help="asked after the document (with --turns: at every turn "
                                                   "that asks none)")
    p.add_argument("--choices", default=None, help="comma-separated; answers are constrained to one of them")
    p.add_argument("--requests", type=int, default=0, help="per variant (default: one per value)")
    p.add_argument("--rate", type=float, default=1.0, help="Poisson arrival rate, requests per second")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight at most")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--max-tokens", type=int, default=16, help="answer tokens per request")
    p.add_argument("--seed", type=int, default=0, help="of the arrival times")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_replay)
