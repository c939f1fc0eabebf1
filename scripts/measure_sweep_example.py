"""Run the example sweep (`examples/sweeps/agent-status.json`: an agent prompt whose current time and
account status take 20 values each, swept separately) on its model and store what it measured in
`examples/sweeps/agent-status.measured.json`, so any number quoted about it was measured.

    .venv/bin/python scripts/measure_sweep_example.py                 # measure and store
    .venv/bin/python scripts/measure_sweep_example.py --check [--edits N]
        # run the first N edits of each field again; exit 1 when a decision or verdict differs

The sweep is `kvnotes sweep`'s (`commands.sweep.run_sweep`: one prefill per field, every strategy
against recompute on every edit); the stored numbers are its statistics (`vocabulary.sweeps`) and
every edit's decisions, from which the statistics are recomputed and checked offline
(tests/bench/test_sweep_example.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "examples" / "sweeps" / "agent-status.json"
MEASURED = SPEC.with_name("agent-status.measured.json")


def _reporter(label: str, t0: float):
    def report(done: int, total: int) -> None:
        print(f"{label}: {done} of {total} edits ({time.perf_counter() - t0:.0f} s)", flush=True)
    return report


def measure(spec: dict, edits: int | None = None) -> dict:
    from commands.sweep import run_sweep
    from data.settings import get_settings
    from worker.engine import Question, load

    eng = load(spec["model"], data_dir=get_settings().data_dir)
    question = Question(spec["question"], tuple(spec["choices"]), max_new_tokens=spec["max_new_tokens"])
    fields = []
    for field in spec["fields"]:
        t0 = time.perf_counter()
        values = field["values"][:edits] if edits else field["values"]
        result = run_sweep(eng, spec["document"], field["find"], field["label"], values, question,
                           spec["strategies"], spec["threshold"], progress=_reporter(field["label"], t0))
        fields.append({
            "label": field["label"], "seconds": round(time.perf_counter() - t0, 1),
            "edits_done": result["edits_done"], "edits_skipped": result["edits_skipped"],
            "document_prefills": result["document_prefills"], "policy": result["policy"],
            "strategies": result["strategies"],
            "edits": [{"value": e["values"][field["label"]], "decisions": e["decisions"],
                       "edit_followed": e["edit_followed"]} for e in result["edits"]],
        })
    return {"example": "agent-status", "model": spec["model"],
            "written_by": "scripts/measure_sweep_example.py", "device": str(eng.device), "fields": fields}


def differences(stored: dict, fresh: dict) -> list[str]:
    out = []
    for old, new in zip(stored["fields"], fresh["fields"]):
        for a, b in zip(old["edits"], new["edits"]):
            for name, decision in b["decisions"].items():
                if a["decisions"].get(name) != decision or a["edit_followed"].get(name) != \
                        b["edit_followed"].get(name):
                    out.append(f"{old['label']} = {b['value']}, {name}: stored {a['decisions'].get(name)!r} "
                               f"({a['edit_followed'].get(name)}), now {decision!r} "
                               f"({b['edit_followed'].get(name)})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored measurement")
    parser.add_argument("--edits", type=int, default=None, help="only the first N values of each field")
    args = parser.parse_args(argv)
    spec = json.loads(SPEC.read_text())
    fresh = measure(spec, args.edits)
    if args.check:
        problems = differences(json.loads(MEASURED.read_text()), fresh)
        for line in problems:
            print(line)
        checked = sum(len(f["edits"]) for f in fresh["fields"])
        print(f"{'drift' if problems else 'ok'}: {checked} edits checked")
        return 1 if problems else 0
    MEASURED.write_text(json.dumps(fresh, indent=1, ensure_ascii=False) + "\n")
    for f in fresh["fields"]:
        print(f"{f['label']}: {f['edits_done']} edits in {f['seconds']} s; policy {f['policy']['strategy']}: "
              f"{f['policy']['sentence']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
