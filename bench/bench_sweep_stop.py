"""Stop when decided (issue 31 item 5), shown on a real model through the command a user types:
`kvnotes sweep --json` on one field of an example sweep, once with `--stop-when-decided` and once
without, each in its own process. From the unstopped sweep's stored edits the policy is recomputed
after every edit (`vocabulary.sweeps.sweep_stats`, the code the sweep itself uses), so the table says
at which edit the policy first became decided, and whether the stopping sweep stopped exactly there
with the same decisions. Written to `docs/sweep-stopping.md`.

The default is the destination-city field of `examples/sweeps/destination-city.json` (45 values, a
free answer) on smollm2-135m: the field the model reads back, so recompute's answer moves and
strategies can be told apart. (docs/sweep-stopping.md was written on the example before it, the
account status of an agent prompt, 20 values.)
(The held-out MuSiQue records of `bench/bench_sweep_heldout.py` cannot show this:
in the 100 records only 4 state the gold answer within their first ~1,000 tokens, and on the one
measured, example 6, recompute's answer never moved.)

    .venv/bin/python bench/bench_sweep_stop.py [--example examples/sweeps/destination-city.json]
        [--field 0] [--threshold 0.5] [--model smollm2-135m] [--out docs/sweep-stopping.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_sweep_heldout import kvnotes  # noqa: E402  (one `kvnotes … --json` in its own process)


def replay(result: dict, label: str, threshold: float) -> list[dict]:
    """The policy after each of `result`'s edits, recomputed from its stored decisions."""
    from vocabulary.sweeps import EditRecord, Outcome, sweep_stats

    choices = bool(result["choices"])
    records = [EditRecord(position=i, group="", values={label: next(iter(e["values"].values()))},
                          expected=None, run_id=0,
                          outcomes={n: Outcome(decision=d, followed=e["edit_followed"][n], kl=0.0,
                                               tokens=e["tokens_computed"][n], prefix_cache_share=0.0,
                                               ttft_ms=0.0)
                                    for n, d in e["decisions"].items()})
               for i, e in enumerate(result["edits"])]
    out = []
    for k in range(1, len(records) + 1):
        stats = sweep_stats(records[:k], list(result["strategies"]), choices, threshold)
        pol = stats.policy
        below = [st.name for st in pol.standings if st.below]
        ref = stats.strategies["recompute"]
        out.append({"k": k, "policy": pol.strategy, "decided": pol.decided, "proven_below": below,
                    "changed": ref.changed.n, "determined": ref.agreement.n,
                    "bounds": {st.name: (stats.strategies[st.name].agreement.lower,
                                         stats.strategies[st.name].changed.lower)
                               for st in pol.standings}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default=str(ROOT / "examples" / "sweeps" / "destination-city.json"))
    parser.add_argument("--field", type=int, default=0, help="which of the example's fields (0-based)")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default=str(ROOT / "docs" / "sweep-stopping.md"))
    args = parser.parse_args(argv)

    spec = json.loads(Path(args.example).read_text())
    field = spec["fields"][args.field]
    doc = Path(tempfile.mkdtemp(prefix="kvnotes-stop-")) / "document.txt"
    doc.write_text(spec["document"], encoding="utf-8")
    common = ["sweep", "--model", args.model, "--document", str(doc), "--field", field["find"],
              "--label", field["label"], "--values", ",".join(field["values"]),
              "--question", spec["question"], "--max-new-tokens", str(spec["max_new_tokens"]),
              "--threshold", str(args.threshold), "--timed-edits", "1"]
    if spec.get("choices"):
        common += ["--choices", ",".join(spec["choices"])]
    loads = [os.getloadavg()[0]]
    stopping = kvnotes(*common, "--stop-when-decided")
    loads.append(os.getloadavg()[0])
    print(f"stopping sweep: {stopping['stopped']} after {stopping['edits_done']} edits "
          f"({stopping['_wall_s']:.0f} s)", flush=True)
    full = kvnotes(*common)
    loads.append(os.getloadavg()[0])
    print(f"full sweep: {full['stopped']} after {full['edits_done']} edits ({full['_wall_s']:.0f} s)",
          flush=True)
    steps = replay(full, field["label"], args.threshold)
    text = markdown(args, spec, field, stopping, full, steps, loads)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


def markdown(args, spec: dict, field: dict, stopping: dict, full: dict, steps: list[dict],
             loads: list[float]) -> str:
    first = next((s["k"] for s in steps if s["decided"]), None)
    n = stopping["edits_done"]
    same = [a["decisions"] for a in stopping["edits"]] == [b["decisions"] for b in full["edits"][:n]]
    names = list(steps[-1]["bounds"])
    lines = [
        "# Stop when decided, on a real model",
        "",
        f"Written by `bench/bench_sweep_stop.py` on {args.model} (CPU, {os.cpu_count()} cores; load average "
        f"{min(loads):.1f} to {max(loads):.1f}). The sweep: the {field['label']!r} field of "
        f"`{Path(args.example).relative_to(ROOT)}` ({len(field['values'])} values, "
        f"{full['document_tokens']} tokens, the question \"{spec['question']}\", "
        f"{'choices ' + ', '.join(spec['choices']) if spec.get('choices') else 'a free answer'}), "
        f"threshold {args.threshold}. Each sweep is one command in its own process:",
        "",
        f"    kvnotes sweep --json --document … --field {field['find']!r} --values … "
        f"--threshold {args.threshold} --timed-edits 1 --stop-when-decided",
        "    kvnotes sweep … (the same, without --stop-when-decided)",
        "",
        f"Intervals: {full['interval']}.",
        "",
        "## What each sweep said",
        "",
        "| sweep | stopped | edits done | policy | decided | wall (s) |",
        "|---|---|---:|---|---|---:|",
    ]
    for words, r in (("--stop-when-decided", stopping), ("without stopping", full)):
        lines.append(f"| {words} | {r['stopped']} | {r['edits_done']} of {r['edits_total']} | "
                     f"{r['policy']['strategy']} | {r['policy']['decided']} | {r['_wall_s']:.0f} |")
    lines += [
        "",
        f"- The stopping sweep: {stopping['policy']['sentence']}.",
        f"- Without stopping, after all {full['edits_done']} edits: {full['policy']['sentence']}.",
        f"- The stopping sweep's {n} edits decided {'the same' if same else 'NOT the same'} as the first {n} "
        "of the unstopped sweep, strategy by strategy.",
        f"- Recomputed from the unstopped sweep's edits, the policy was first decided after edit "
        f"**{first}**; the stopping sweep stopped after edit **{n}**"
        + (" (as soon as it was decided)." if first == n else " (NOT where it was first decided)."),
        "",
        "## The policy after each edit (recomputed from the unstopped sweep's decisions)",
        "",
        "Each candidate's two lower bounds: agreement on every determined edit / on the changed edits.",
        "",
        "| edit | changed edits | policy | decided | proven below | " + " | ".join(names) + " |",
        "|---:|---:|---|---|---|" + "---:|" * len(names),
    ]
    for s in steps:
        cells = [f"{a:.2f} / {c:.2f}" for a, c in (s["bounds"][nm] for nm in names)]
        lines.append(f"| {s['k']} | {s['changed']} | {s['policy']} | {s['decided']} | "
                     f"{', '.join(s['proven_below']) or '-'} | " + " | ".join(cells) + " |")
    cost = full["cost"]["decision_only"]
    lines += [
        "",
        "## What an edit cost here",
        "",
        f"A decision-only edit took {cost['median_ms']:.0f} ms, {cost['median_prefills']:.1f}x one prefill "
        f"of this {full['document_tokens']}-token document (median of {cost['edits']}): on a short "
        f"document with a free answer, generating up to {spec['max_new_tokens']} tokens for each of "
        f"{len(full['strategies'])} strategies is the edit's cost, not the prefill. The 2.0x goal is for "
        "~1,000-token records (`docs/sweep-heldout-2choices.md`: 1.43x).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
