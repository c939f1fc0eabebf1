"""Every forward ONE decision-only sweep edit makes, and its tokens, against one prefill of the document
(issue 31: a decision-only edit should cost at most 2.0× one prefill).

A sweep's edit past its timed sample is `eng.run(RunRequest(..., timing=False,
check_reference=False), notes=notes)` with every sweep strategy (`vocabulary.sweeps.SWEEP_STRATEGIES`)
on a choice question. A hook on the model counts each forward: its batch, its length, the notes it
read after, its wall time. The edits run from the same notes: the first also pays what a sweep pays
once (hoist's layout of the document, stale's readout); each later one, what every later edit
costs, runs right after a prefill of the document, and its ratio to that prefill is taken in wall
time and in this process's CPU time (steadier than wall time on a machine others load).

    .venv/bin/python bench/sweep_forwards.py [--record shipment|musique] [--choices 2|13]

`--record musique` builds the held-out ~1,000-token MuSiQue record of `bench/bench_readout.py`
(`/work/shared/data/musique_dev.json`), its choices the old and new answers and 11 others'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PORTS = ("Madrid", "Lisbon", "Rotterdam", "Hamburg", "Gdansk", "Tallinn", "Riga", "Helsinki", "Stockholm",
         "Copenhagen", "Aarhus", "Bergen")
QUESTION = "What is the destination of this shipment?"


def _case(record: str, n_choices: int, count) -> dict:
    if record == "musique":
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_readout import record as musique

        r = musique(1000, n_choices, count)
        return {"name": f"MuSiQue example {r['example']}", "document": r["document"], "start": r["start"],
                "end": r["end"], "values": [r["new"], r["choices"][2] if n_choices > 2 else r["new"]],
                "question": r["question"], "choices": r["choices"][:n_choices]}
    spec = json.loads((ROOT / "examples" / "shipment-log.json").read_text())
    document = spec["document"]
    start = document.index("Oslo")
    choices = ["Oslo", *PORTS][:n_choices]
    return {"name": "shipment log", "document": document, "start": start, "end": start + 4,
            "values": ["Madrid", choices[-1] if n_choices > 2 else "Madrid"], "question": QUESTION,
            "choices": choices}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", choices=("shipment", "musique"), default="shipment")
    parser.add_argument("--choices", type=int, default=2, help="how many choices (2 or 13)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3, help="later edits, each after a prefill")
    args = parser.parse_args(argv)
    from data.settings import get_settings
    from vocabulary.sweeps import SWEEP_STRATEGIES
    from worker.engine import Field, Question, RunRequest, load

    eng = load(args.model, device="cpu", data_dir=get_settings().data_dir)
    case = _case(args.record, args.choices, lambda text: len(eng.tokenize_document(text)[0]))
    question = Question(case["question"], tuple(case["choices"]))
    seen: list[dict] = []

    def before(module, a, kwargs):
        ids, cache = kwargs["input_ids"], kwargs.get("cache")
        seen.append({"batch": ids.shape[0], "length": ids.shape[1], "t0": time.perf_counter(),
                     "after": cache.get_seq_length() if cache is not None else 0})

    def after(module, a, kwargs, out):
        seen[-1]["ms"] = (time.perf_counter() - seen[-1]["t0"]) * 1000

    eng.model.register_forward_pre_hook(before, with_kwargs=True)
    eng.model.register_forward_hook(after, with_kwargs=True)
    eng.warm_up()

    def timed(work):
        t0, c0 = time.perf_counter(), time.process_time()
        out = work()
        return out, time.perf_counter() - t0, time.process_time() - c0

    def edit(value):
        seen.clear()
        request = RunRequest(document=case["document"], question=question, strategies=tuple(SWEEP_STRATEGIES),
                             fields=(Field(case["start"], case["end"], value, "value"),), timing=False,
                             check_reference=False)
        report, wall, cpu = timed(lambda: eng.run(request, notes=notes))
        return {"value": value, "wall": wall, "cpu": cpu, "forwards": list(seen), "load": os.getloadavg()[0],
                "decisions": {n: r.decision for n, r in report.strategies.items()}}

    notes, wall, cpu = timed(lambda: eng.prefill(case["document"]))
    print(f"{case['name']}: {notes.n_tokens} tokens, {len(question.choices)} choices, strategies "
          f"{', '.join(SWEEP_STRATEGIES)}; load {os.getloadavg()[0]:.1f}", flush=True)
    first = edit(case["values"][0])
    _show("first edit (also lays out hoist's document once, reads stale once)", first, wall, cpu)
    pairs = []
    for i in range(args.rounds):  # one prefill, then one edit, back to back: a ratio per round
        _, wall, cpu = timed(lambda: eng.prefill(case["document"]))
        pairs.append((wall, cpu, edit(case["values"][(i + 1) % len(case["values"])])))
        _show(f"round {i + 1}: a later edit", pairs[-1][2], wall, cpu, details=i == 0)
    walls = [e["wall"] / w for w, _, e in pairs]
    cpus = [e["cpu"] / c for _, c, e in pairs]
    print(f"later edit / one prefill, median of {len(pairs)} rounds: wall {statistics.median(walls):.2f}× "
          f"({', '.join(f'{r:.2f}' for r in walls)}), CPU time {statistics.median(cpus):.2f}× "
          f"({', '.join(f'{r:.2f}' for r in cpus)})")
    return 0


def _show(what: str, edit: dict, prefill_wall: float, prefill_cpu: float, details: bool = True) -> None:
    f, wall, cpu = edit["forwards"], edit["wall"], edit["cpu"]
    print(f"{what}, {edit['value']}: {len(f)} forwards, {sum(x['batch'] * x['length'] for x in f)} input "
          f"slots; wall {wall:.2f} s against a prefill's {prefill_wall:.2f} s ({wall / prefill_wall:.2f}×), "
          f"CPU {cpu:.2f} s against {prefill_cpu:.2f} s ({cpu / prefill_cpu:.2f}×); "
          f"load {edit['load']:.1f}", flush=True)
    if details:
        for x in f:
            print(f"    batch {x['batch']:>2} × {x['length']:>5} inputs after {x['after']:>5} notes: "
                  f"{x.get('ms', float('nan')):8.0f} ms")
        print(f"    decisions: {edit['decisions']}")


if __name__ == "__main__":
    sys.exit(main())
