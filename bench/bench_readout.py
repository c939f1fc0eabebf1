"""A strategy's time to first token is one readout (issue 31 item 4), measured on held-out MuSiQue
records (`/work/shared/data/musique_dev.json`, CC BY 4.0; CacheBlend's subset, see its README), on
smollm2-135m, and printed as a table (written to `docs/readout.md`):

1. 13 choices on a ~1,000-token record: stale's time to first token against recompute's (goal: at
   most a quarter), with what reading the choices over their 8 orders took apart (`measure_ms`).
2. 2 choices on a ~2,000-token record: erratum's speed-up over recompute with this code and with the
   code before issue 23 (commit f943b23, checked out as a scratch `git worktree` outside the repo),
   side by side in one run: each arm is a subprocess on its own code, run one after the other, and
   each speed-up is recompute's median first token over erratum's (the same formula for both arms;
   this code's paired `speedup` is printed beside it). Goal: at least 0.8× the old code's.

The record: the passages of one example laid end to end until the token budget; the field is the
first occurrence of the gold answer in them, changed to another example's answer; the question is
the example's, the choices the old and new answers (and 11 other examples' answers for 13).

    .venv/bin/python bench/bench_readout.py [--old /tmp/kvnotes-old] [--out docs/readout.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("KVNOTES_MUSIQUE", "/work/shared/data/musique_dev.json"))
OLD_COMMIT = "f943b23"  # the last commit before issue 23's sweeps (and its readout over orders)


def record(tokens: int, n_choices: int, count) -> dict:
    """A held-out record of about `tokens` tokens with a field (the gold answer's first occurrence)."""
    items = json.loads(DATA.read_text())
    others = [it["answers"][0] for it in items]
    for i, item in enumerate(items):
        answer = item["answers"][0]
        text = ""
        for ctx in item["ctxs"]:
            text += f"{ctx['title']}\n\n{ctx['text']}\n\n"
            if count(text) >= tokens:
                break
        at = text.find(answer)
        if at < 0 or len(answer) < 3 or count(text) < tokens * 0.9:
            continue
        pool = [o for o in others if o != answer and o not in text and 2 < len(o) < 30]
        new = pool[i % len(pool)]
        extra = [o for o in dict.fromkeys(pool) if o != new][: n_choices - 2]
        question = item["question"][0].upper() + item["question"][1:]
        return {"example": i, "document": text, "start": at, "end": at + len(answer), "old": answer,
                "new": new, "question": question, "choices": [answer, new, *extra],
                "tokens": count(text)}
    raise SystemExit("no record fits")


def arm(spec: dict) -> dict:
    """One arm, on the code `sys.path` finds: the report's first tokens and speed-ups."""
    from worker.engine import Field, Question, load

    eng = load(spec["model"], device="cpu", data_dir=Path(spec["data_dir"]))
    eng.warm_up()
    notes = eng.prefill(spec["document"])
    out = []
    for _ in range(spec["repeats"]):
        report = eng.edit(notes, [Field(spec["start"], spec["end"], spec["new"], "answer")],
                          Question(spec["question"], tuple(spec["choices"])), strategies=spec["strategies"])
        out.append({name: {"ttft_ms": r.ttft_ms, "speedup": getattr(r, "speedup", None),
                           "measure_ms": getattr(r, "measure_ms", None), "decision": r.decision}
                    for name, r in report.strategies.items()})
    return {"runs": out, "document_tokens": report.document_tokens}


def _run_arm(root: Path, spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--arm", json.dumps(spec)],
                          cwd=root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"arm at {root} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(runs: list[dict], slow: str, fast: str) -> float:
    return statistics.median(r[slow]["ttft_ms"] / r[fast]["ttft_ms"] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--old", default="/tmp/kvnotes-old",
                        help=f"where the scratch worktree of the old code ({OLD_COMMIT}) is (made with "
                             f"`git worktree add --detach DIR {OLD_COMMIT}` if absent)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=1, help="runs per arm")
    parser.add_argument("--out", default=str(ROOT / "docs" / "readout.md"))
    parser.add_argument("--thirteen-only", action="store_true",
                        help="the 13-choice part only, its table printed (docs/readout.md left alone)")
    args = parser.parse_args(argv)
    if args.arm is not None:
        print(json.dumps(arm(json.loads(args.arm))))
        return 0
    sys.path.insert(0, str(ROOT))
    from data.settings import get_settings
    from worker.engine import load

    eng = load(args.model, device="cpu", data_dir=get_settings().data_dir)
    count = lambda text: len(eng.tokenize_document(text)[0])  # noqa: E731
    data_dir = str(get_settings().data_dir.resolve())
    thirteen = record(1000, 13, count)
    base = {"model": args.model, "data_dir": data_dir, "repeats": args.repeats}
    print(f"13 choices: example {thirteen['example']}, {thirteen['tokens']} tokens (load "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    many = _run_arm(ROOT, {**base, **thirteen, "strategies": ["recompute", "stale"]})
    if args.thirteen_only:
        print("\n".join(_thirteen(args, thirteen, many)))
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        return 0
    old = Path(args.old)
    if not old.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(old), OLD_COMMIT], cwd=ROOT, check=True)
    two = record(2000, 2, count)
    print(f"2 choices: example {two['example']}, {two['tokens']} tokens", flush=True)
    pair = {**base, **two, "strategies": ["recompute", "erratum"]}
    arms = {"this code": _run_arm(ROOT, pair), f"before issue 23 ({OLD_COMMIT})": _run_arm(old, pair)}
    text = markdown(args, thirteen, many, two, arms)
    Path(args.out).write_text(text)
    print(text)
    return 0


def _thirteen(args, thirteen: dict, many: dict) -> list[str]:
    runs = many["runs"]
    stale = statistics.median(r["stale"]["ttft_ms"] for r in runs)
    ref = statistics.median(r["recompute"]["ttft_ms"] for r in runs)
    lines = [
        f"## 13 choices (example {thirteen['example']}, {many['document_tokens']} tokens)",
        "",
        "| strategy | time to first token (ms) | choices over 8 orders, apart (measure_ms) | decision |",
        "|---|---:|---:|---|",
    ]
    for name in ("recompute", "stale"):
        r = runs[-1][name]
        lines.append(f"| {name} | {statistics.median(x[name]['ttft_ms'] for x in runs):.0f} | "
                     f"{r['measure_ms']:.0f} | {r['decision']} |")
    return lines + ["", f"stale's first token is **{stale / ref:.3f}×** recompute's (goal: at most 0.25).",
                    ""]


def markdown(args, thirteen: dict, many: dict, two: dict, arms: dict) -> str:
    lines = [
        "# Readout that scales: one readout per first token",
        "",
        f"Written by `bench/bench_readout.py` on {args.model} (CPU; the machine shared with other "
        f"engineers' tests, so only ratios measured in this run count). Held-out records from "
        f"MuSiQue (`musique_dev.json`, CacheBlend's subset, CC BY 4.0), nobody here wrote them.",
        "",
        *_thirteen(args, thirteen, many),
    ]
    lines += [f"## 2 choices (example {two['example']}, {arms['this code']['document_tokens']} tokens)",
              "", "| code | recompute TTFT (ms) | erratum TTFT (ms) | erratum speed-up | paired speed-up |",
              "|---|---:|---:|---:|---:|"]
    ups = {}
    for name, res in arms.items():
        rs = res["runs"]
        ups[name] = _ratio(rs, "recompute", "erratum")
        paired = rs[-1]["erratum"]["speedup"]
        lines.append(f"| {name} | {statistics.median(r['recompute']['ttft_ms'] for r in rs):.0f} | "
                     f"{statistics.median(r['erratum']['ttft_ms'] for r in rs):.0f} | {ups[name]:.1f}× | "
                     f"{'' if paired is None else f'{paired:.1f}×'} |")
    new, old = ups["this code"], [v for k, v in ups.items() if k != "this code"][0]
    lines += ["", f"erratum's speed-up with this code is **{new / old:.2f}×** the old code's (goal: at least "
              "0.8×). The arms ran one after the other in this run, each a subprocess on its own code.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
