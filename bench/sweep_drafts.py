"""What a draft saves a decision-only free answer (issue 42): the same sweep with and without drafts.

A decision-only sweep edit decodes every strategy's free answer in one batched pass
(`worker.engine.decode`); with drafts, each row first reads its guess at the answer (the same
strategy's answer at the edit before, the field's old value replaced by the new one) in its prompt
forward, and keeps what greedy decoding would choose of it. This script runs one sweep both ways on
the shipment log (`examples/shipment-log.json`, its destination set to 10 ports, "Where is this
shipment going? Answer with the city only.", 6 strategies) and prints, per way: the sweep's wall
time, its one-token decode steps and forwards (counted by a hook on the model's forward), and
whether every edit's decisions are the same both ways.

    .venv/bin/python bench/sweep_drafts.py [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTION = "Where is this shipment going? Answer with the city only."
VALUES = ["Madrid", "Riga", "Bergen", "Lisbon", "Tallinn", "Gdansk", "Hamburg", "Antwerp", "Genoa", "Dublin"]
STRATEGIES = ["recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    from commands.sweep import run_sweep
    from data.settings import get_settings
    from worker.engine import Question, load
    from worker.engine.strategies import measure

    eng = load(args.model, device="cpu", data_dir=get_settings().data_dir)
    eng.warm_up()
    document = json.loads((ROOT / "examples" / "shipment-log.json").read_text())["document"]
    question = Question(QUESTION, (), max_new_tokens=6)
    notes = eng.prefill(document)
    rows, decisions = [], []
    for drafts in (True, False):
        notes.derived.clear()  # nothing kept from the other way's sweep
        measure.DRAFTS = drafts
        shapes: list[tuple[int, int]] = []
        hook = eng.model.register_forward_pre_hook(
            lambda module, a, kwargs, seen=shapes: seen.append(tuple(kwargs["input_ids"].shape)),
            with_kwargs=True)
        started, load_before = time.perf_counter(), os.getloadavg()[0]
        try:
            out = run_sweep(eng, document, "Oslo", "destination", VALUES, question, STRATEGIES, timed_edits=0,
                            notes=notes)
        finally:
            hook.remove()
            measure.DRAFTS = True
        wall = time.perf_counter() - started
        decisions.append([e["decisions"] for e in out["edits"]])
        rows.append(f"| {'on' if drafts else 'off'} | {len(out['edits'])} | {wall:.1f} "
                    f"| {sum(t == 1 for _, t in shapes)} | {len(shapes)} "
                    f"| {load_before:.1f}–{os.getloadavg()[0]:.1f} |")
    print(f"{args.model}, {len(VALUES)} edits, {len(STRATEGIES)} strategies, up to 6 answer tokens\n")
    print("| drafts | edits | sweep wall (s) | one-token decode steps | forwards | load |")
    print("|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    same = decisions[0] == decisions[1]
    print(f"\nevery edit's decisions the same both ways: {'yes' if same else 'NO'}; "
          f"recompute answered: {', '.join(repr(d['recompute']) for d in decisions[0])}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
