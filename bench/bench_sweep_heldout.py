"""Issue 31's checks on a held-out record, through the commands a user types (`kvnotes sweep --json
--timed-edits 1` and `kvnotes edit --json`), written to `docs/sweep-heldout.md`:

- what a decision-only sweep edit costs against one prefill of the document, both measured in the
  same run (the sweep's `cost`; goal: at most 2.0x);
- that the sweep's decisions equal `kvnotes edit`'s on the same values, strategy by strategy;
- with 13 choices, stale's time to first token against recompute's, on the sweep's timed edit
  (goal: at most a quarter);
- that a `--stop-when-decided` sweep stops as soon as its policy is decided, and says so.

The record is MuSiQue's (`/work/shared/data/musique_dev.json`, CC BY 4.0; `bench/bench_readout.py`
builds it): an example's passages laid end to end to about 1,000 tokens, the field the gold answer's
first occurrence, the choices the answer and 12 other examples' answers, and the sweep's values
those 12 (every value among the choices). Nobody here wrote it.

    .venv/bin/python bench/bench_sweep_heldout.py [--tokens 1000] [--choices 13] [--check N] \\
        [--threshold 0.5] [--model smollm2-135m] [--out docs/sweep-heldout.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kvnotes(*args: str) -> dict:
    """One `kvnotes … --json` in its own process (the command a user types), its JSON output."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "commands.cli", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"kvnotes {args[0]} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    out["_wall_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1000, help="the record's length, about")
    parser.add_argument("--choices", type=int, default=13, help="how many choices (values: all but the old)")
    parser.add_argument("--edits", type=int, default=None,
                        help="how many edits: the values cycle through the choices but the old (default: "
                             "each once); with 2 choices the one other value again and again")
    parser.add_argument("--check", type=int, default=None,
                        help="compare with `kvnotes edit` on the first N values (default: all)")
    parser.add_argument("--threshold", type=float, default=0.5, help="the stopping sweep's threshold")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default=str(ROOT / "docs" / "sweep-heldout.md"))
    args = parser.parse_args(argv)

    from bench.bench_readout import record
    from data.settings import get_settings
    from vocabulary.sweeps import SWEEP_STRATEGIES
    from worker.engine import load

    eng = load(args.model, device="cpu", data_dir=get_settings().data_dir)
    rec = record(args.tokens, args.choices, lambda text: len(eng.tokenize_document(text)[0]))
    eng = None  # each command below loads its own
    values = [c for c in rec["choices"] if c != rec["old"]]
    if args.edits is not None:
        values = [values[i % len(values)] for i in range(args.edits)]
    doc = Path(tempfile.mkdtemp(prefix="kvnotes-heldout-")) / "record.txt"
    doc.write_text(rec["document"], encoding="utf-8")
    old = rec["old"]
    common = ["--model", args.model, "--document", str(doc), "--question", rec["question"],
              "--choices", ",".join(rec["choices"])]
    strategies = ",".join(SWEEP_STRATEGIES)
    print(f"example {rec['example']}: {rec['tokens']} tokens, field {old!r}, {len(values)} values",
          flush=True)
    loads = [os.getloadavg()[0]]
    # the edit's label is the field's old text (what `kvnotes edit --replace OLD NEW` calls it), so the
    # errata are the same words in both commands
    sweep = kvnotes("sweep", *common, "--field", old, "--label", old, "--values", ",".join(values),
                    "--strategies", strategies, "--timed-edits", "1")
    loads.append(os.getloadavg()[0])
    print(f"sweep: {sweep['edits_done']} edits in {sweep['_wall_s']:.0f} s; cost {sweep['cost']}", flush=True)
    stopping = kvnotes("sweep", *common, "--field", old, "--label", old, "--values", ",".join(values),
                       "--strategies", strategies, "--timed-edits", "1", "--stop-when-decided",
                       "--threshold", str(args.threshold))
    loads.append(os.getloadavg()[0])
    print(f"stopping sweep: {stopping['stopped']} after {stopping['edits_done']} edits", flush=True)
    distinct = list(dict.fromkeys(values))  # `kvnotes edit` once per distinct value
    checked = distinct if args.check is None else distinct[:args.check]
    compared = []
    for value in checked:
        i = values.index(value)
        edit = kvnotes("edit", *common, "--replace", old, value, "--strategies", strategies)
        loads.append(os.getloadavg()[0])
        ours = sweep["edits"][i]["decisions"]
        theirs = {name: r["decision"] for name, r in edit["strategies"].items()}
        compared.append((value, ours, theirs))
        same = sum(ours[n] == theirs.get(n) for n in ours)
        print(f"edit {value!r}: {same} of {len(ours)} decisions equal", flush=True)
    text = markdown(args, rec, sweep, stopping, compared, loads)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


def markdown(args, rec: dict, sweep: dict, stopping: dict, compared: list, loads: list[float]) -> str:
    cost = sweep["cost"]
    only, timed = cost["decision_only"], cost["timed"]
    first = sweep["edits"][0]["ttft_ms"]
    ratio = first["stale"] / first["recompute"]
    names = list(sweep["edits"][0]["decisions"])
    equal = sum(ours[n] == theirs.get(n) for _, ours, theirs in compared for n in names)
    total = len(compared) * len(names)
    lines = [
        "# Sweeps that decide, on a held-out record",
        "",
        f"Written by `bench/bench_sweep_heldout.py` on {args.model} (CPU, {os.cpu_count()} cores; load "
        f"average {min(loads):.1f} to {max(loads):.1f} during the run). The record: MuSiQue example "
        f"{rec['example']} (`musique_dev.json`, CC BY 4.0), {sweep['document_tokens']} tokens, nobody "
        f"here wrote it. The field is the gold answer {rec['old']!r} at its first occurrence; the question "
        f"is the example's (\"{rec['question']}\"); the choices are the answer and "
        f"{len(rec['choices']) - 1} other examples' answers, and the sweep's {sweep['edits_total']} values "
        f"cycle through those {len(rec['choices']) - 1}.",
        "",
        "Commands, as a user types them (each in its own process, the model loaded by each):",
        "",
        "    kvnotes sweep --json --timed-edits 1 --document record.txt --field OLD --label OLD \\",
        "        --values V1,…,Vn --question Q --choices C1,…,Ck --strategies " + ",".join(names[:-1]),
        f"    kvnotes sweep … --stop-when-decided --threshold {args.threshold}",
        "    kvnotes edit --json --document record.txt --replace OLD Vi --question Q --choices … "
        "--strategies …",
        "",
        "## What an edit costs, against one prefill measured in the same run",
        "",
        "| edits | count | median (ms) | median, in prefills | max, in prefills |",
        "|---|---:|---:|---:|---:|",
    ]
    for words, part in (("timed (paired rounds)", timed), ("decision-only", only)):
        if part:
            lines.append(f"| {words} | {part['edits']} | {part['median_ms']:.0f} | "
                         f"{part['median_prefills']:.2f}x | {part['max_prefills']:.2f}x |")
    lines += [
        "",
        f"One prefill of the document took {', '.join(f'{ms:.0f}' for ms in cost['prefill_ms'])} ms "
        f"(before the first edit and after the last). A decision-only edit cost "
        f"**{only['median_prefills']:.2f}x** one prefill (median of {only['edits']}; goal: at most 2.0x)."
        if only else "No decision-only edit ran.",
        "",
        f"## stale's first token against recompute's ({len(rec['choices'])} choices)",
        "",
        f"On the sweep's timed edit: recompute {first['recompute']:.0f} ms, stale {first['stale']:.0f} ms: "
        f"**{ratio:.3f}x** (goal, with 13 choices: at most 0.25).",
        "",
        "## The sweep's decisions against `kvnotes edit`'s, on the same values",
        "",
        f"**{equal} of {total}** decisions equal ({len(compared)} values x {len(names)} strategies).",
        "",
        "| value | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for value, ours, theirs in compared:
        cells = [ours[n] if ours[n] == theirs.get(n) else f"{ours[n]} / edit: {theirs.get(n)}" for n in names]
        lines.append(f"| {value} | " + " | ".join(cells) + " |")
    policy = stopping["policy"]
    lines += [
        "",
        f"## Stop when decided (threshold {args.threshold})",
        "",
        f"Stopped: **{stopping['stopped']}** after {stopping['edits_done']} of {stopping['edits_total']} "
        f"edits. Policy: {policy['strategy']} (decided: {policy['decided']}): {policy['sentence']}",
        "",
        f"Without stopping, the policy after all {sweep['edits_done']} edits: {sweep['policy']['strategy']} "
        f"(at the default threshold {sweep['threshold']}): {sweep['policy']['sentence']}",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
