"""An agent support session as a trajectory (issue 26): a support record with an account status, and
N turns (28 by default) that each append a tool result, the status changing twice (suspended at
turn N/3, active again at 2N/3). Every strategy carries its own cache through the turns on the
bundled model, side by side in one run (`worker.engine.trajectory`); the per-strategy agreement,
largest KL, cumulative tokens and cumulative TTFT go to `docs/trajectories.md`. The turns are also
written to `examples/support-trajectory.jsonl` (the input of `kvnotes trajectory`) and the record to
`examples/support-record.txt`; what follows `KEEP` in the output (the vLLM replay) is kept.

    .venv/bin/python bench/bench_trajectory.py [--turns 28] [--model smollm2-135m] \\
        [--out docs/trajectories.md]

Timings are this machine's, one process, strategies read one after another at each turn.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORD = ("SUPPORT SESSION: account record\n"
          "Account holder: Dana Lee\nstatus: active\nPlan: business\nRegion: north\n\n"
          "Policy: only accounts whose status is active may log in or receive a refund.\n")
# what follows this line in the output is kept when the benchmark writes it again
KEEP = "<!-- written by hand below: kept by bench/bench_trajectory.py -->"
TOOLS = ["billing.lookup: last invoice paid on time", "auth.lookup: 2 failed logins this week",
         "tickets.lookup: the customer asks for a refund", "usage.lookup: 14 seats in use",
         "audit.lookup: no unusual activity", "mail.lookup: the customer wrote again"]


def turns(n: int) -> list[dict]:
    out = []
    for i in range(n):
        turn: dict = {"append": f"\n[turn {i + 1}] {TOOLS[i % len(TOOLS)]} (ticket #{4100 + i})."}
        if i == n // 3:
            turn["fields"] = {"status": "suspended"}
        elif i == 2 * n // 3:
            turn["fields"] = {"status": "active"}
        out.append(turn)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=28)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default=str(ROOT / "docs" / "trajectories.md"))
    args = parser.parse_args()

    from vocabulary import FLOOR
    from vocabulary.trajectories import ONE_PER_FIELD, FieldSpec, TrajectorySpec, TurnSpec, carried
    from worker.engine import load
    from worker.engine.trajectory import request_of, trajectory

    rows = turns(args.turns)
    (ROOT / "examples" / "support-trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (ROOT / "examples" / "support-record.txt").write_text(RECORD)  # the document, for kvnotes replay --turns
    start = RECORD.index("active")
    keys = [*carried(), *(f"{k}.{ONE_PER_FIELD}" for k in ("erratum", "field_erratum"))]
    spec = TrajectorySpec(model=args.model, document=RECORD, fields=(FieldSpec("status", start, start + 6),),
                          turns=tuple(TurnSpec(append=r["append"], fields=r.get("fields", {})) for r in rows),
                          question="May Dana log in now?", choices=("yes", "no"), strategies=tuple(keys))
    eng = load(args.model, device="cpu")
    t0 = time.perf_counter()
    def progress(i: int, _turn) -> None:
        print(f"turn {i + 1}/{args.turns}", file=sys.stderr, flush=True)

    report = trajectory(eng, request_of(spec), progress=progress)
    wall = time.perf_counter() - t0
    summary = report.summary()
    last = report.turns[-1]
    lines = [
        "# Trajectories: each strategy carrying its cache through an agent's turns",
        "",
        f"Written by `bench/bench_trajectory.py` on {platform.machine()} ({platform.system()}), "
        f"{args.model}, float32 on the CPU, in one run of {wall:.0f} s. A support record "
        f"({report.document_tokens} tokens with the frame) and {args.turns} turns, each appending a tool "
        f"result; the account status changes at turns {args.turns // 3 + 1} (suspended) and "
        f"{2 * args.turns // 3 + 1} (active again). The question, asked after every turn: "
        f"\"{spec.question}\" ({', '.join(spec.choices)}). Recompute's last prompt: {last.prompt_tokens} "
        "tokens. "
        "The turns are `examples/support-trajectory.jsonl`.",
        "",
        "| strategy | agreed | 95% CI | max KL | cumulative tokens | cumulative TTFT (ms) | vs recompute |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, s in summary.items():
        ci = s.agreement_ci95 or (0.0, 0.0)
        speed = f"{s.cumulative_speedup:.2f}x" if s.cumulative_speedup else "-"
        lines.append(f"| {k} | {s.agreed}/{s.turns} | {ci[0]:.2f}-{ci[1]:.2f} | {s.max_kl:.3g} | "
                     f"{s.cumulative_tokens} | {s.cumulative_ttft_ms:.0f} | {speed} |")
    lines += ["", "Verdicts:", ""] + [f"- {v}" for v in report.verdicts().values()]
    floor = summary.get(FLOOR)
    if floor is not None and floor.agreed == floor.turns:
        lines += ["", f"Caveat: {FLOOR}, which never sees a change, agreed on every turn too: recompute's "
                  "decision did not follow the status on this model, so agreement does not tell the "
                  "strategies apart here; KL (the drift) and the costs do."]
    lines += ["", "Reading it: on a 135M model on a 2-core CPU every forward pays a fixed pass over the "
              "weights, so the speed-ups of TTFT are far smaller than the tokens saved; the tokens column is "
              "the cost a GPU server pays. Errata strategies keep growing their cache "
              "(`cache_tokens` per turn in the JSON); `.one_per_field` keeps one erratum per field.", ""]
    out = Path(args.out)
    before = out.read_text() if out.exists() else ""
    kept = KEEP + before.split(KEEP, 1)[1] if KEEP in before else ""  # the vLLM section, measured by hand
    out.write_text("\n".join(lines) + ("\n" + kept if kept else ""))
    (ROOT / "bench" / "data").mkdir(exist_ok=True)
    (ROOT / "bench" / "data" / "trajectory.json").write_text(
        json.dumps({"model": report.model, "turns": [asdict(t) for t in report.turns]}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
