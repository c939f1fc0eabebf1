"""Run the example sweep (`examples/sweeps/agent-status.json`: an agent prompt whose current time and
account status take 20 values each, swept separately) on each bundled model and store what it
measured in `examples/sweeps/agent-status.measured.json`, so any number quoted about it was measured.

    .venv/bin/python scripts/measure_sweep_example.py [--model M]     # measure one model, store it
    .venv/bin/python scripts/measure_sweep_example.py --check [--edits N]
        # run the first N edits of each field again on the example's model; exit 1 when a
        # decision or verdict differs
    .venv/bin/python scripts/measure_sweep_example.py --doc      # docs/sweep-example.md from the file

The stored file keeps every model measured (`models`: {name: {device, fields}}; measuring one
model keeps the others'), and the model the example runs on (`model`) with the sentence that says
why (`reason`): the one whose recompute reads the field the question asks about (`reads_back`)
back on the most edits (`vocabulary.readback.choose_sweep_model`). The example's `model` must name
it; the script says so and exits 1 when it does not. Storing a measurement also writes
`docs/sweep-example.md`: both models side by side.

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
DOC = ROOT / "docs" / "sweep-example.md"

from vocabulary.readback import SweepReading, choose_sweep_model  # noqa: E402


def _reporter(label: str, t0: float):
    def report(done: int, total: int) -> None:
        print(f"{label}: {done} of {total} edits ({time.perf_counter() - t0:.0f} s)", flush=True)
    return report


def measure(spec: dict, model: str, edits: int | None = None) -> dict:
    """One model's sweep of every field: per field the statistics, policy and each edit's decisions."""
    from commands.sweep import run_sweep
    from data.settings import get_settings
    from worker.engine import Question, load

    eng = load(model, data_dir=get_settings().data_dir)
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
    return {"device": str(eng.device), "fields": fields}


def reading(model: str, measured: dict, label: str) -> SweepReading:
    """How well `model`'s sweep of the field `label` reads it back (its stored statistics)."""
    field = next(f for f in measured["fields"] if f["label"] == label)
    followed = [e for e in field["edits"] if e["edit_followed"]["recompute"] == "new"]
    kept = sum(e["edit_followed"]["stale"] == "old" for e in followed)
    return SweepReading(model, len(followed), kept, len(field["edits"]))


def stored(spec: dict, models: dict) -> dict:
    """The measured file: every model's sweep, the model chosen and why (models in the order of
    the settings' list, the default first, which breaks ties)."""
    from data.settings import get_settings

    order = [m for m in get_settings().models if m in models] + [m for m in models if m not in
                                                                 get_settings().models]
    model, reason = choose_sweep_model([reading(m, models[m], spec["reads_back"]) for m in order])
    return {"example": "agent-status", "written_by": "scripts/measure_sweep_example.py",
            "model": model, "reason": reason, "reads_back": spec["reads_back"],
            "models": {m: models[m] for m in order}}


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


def _share(k: int, n: int, ci: list[float] | None) -> str:
    return f"{k}/{n} [{ci[0]:.2f}, {ci[1]:.2f}]" if n and ci else f"{k}/{n}"


def markdown(spec: dict, measured: dict) -> str:
    """docs/sweep-example.md: per field, every strategy on every model measured, side by side."""
    models = list(measured["models"])
    lines = ["# The example sweep: an agent prompt, on both bundled models", "",
             "Written by `scripts/measure_sweep_example.py` from "
             "`examples/sweeps/agent-status.measured.json`. "
             f"{spec['summary']} The question: \"{spec['question']}\" (free answer, at most "
             f"{spec['max_new_tokens']} tokens), every strategy against recompute on every edit.", "",
             f"**The example runs on {measured['model']}.** {measured['reason']}", ""]
    for i, field in enumerate(spec["fields"]):
        runs = [measured["models"][m]["fields"][i] for m in models]
        lines += [f"## {field['label']} ({len(field['values'])} values, `{field['find']}` in the prompt)", "",
                  "Changed edits: those on which recompute's answer moved (named the new value); agreement: "
                  "the same verdict as recompute where recompute's answer names a value.", "",
                  "| strategy | " + " | ".join(f"changed edits, {m}" for m in models) + " | "
                  + " | ".join(f"agreement, {m}" for m in models)
                  + " | cost share (" + " / ".join(models) + ") |",
                  "|---|" + "---:|" * (2 * len(models) + 1)]
        for name in spec["strategies"]:
            rows = [run["strategies"][name] for run in runs]
            cells = [_share(st["changed"]["agreed"], st["changed"]["edits"], st["changed"]["ci95"])
                     for st in rows]
            cells += [_share(st["agreed"], st["determined"], st["agreement_ci95"])
                      + f" ({st['undetermined']} undetermined)" for st in rows]
            cells.append(" / ".join(f"{st['cost_share']:.1%}" for st in rows))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        for m, run in zip(models, runs):
            said = [e["edit_followed"]["recompute"] for e in run["edits"]]
            words = {"new": "the new value", "old": "the old value", "both": "both", "neither": "neither"}
            verdicts = ", ".join(f"{words[v]} on {said.count(v)}" for v in words if said.count(v))
            lines.append(f"- {m} ({measured['models'][m]['device']}, {run['seconds']:.0f} s for "
                         f"{run['edits_done']} edits on a shared machine): recompute's answer named "
                         f"{verdicts}; policy **{run['policy']['strategy']}**: {run['policy']['sentence']}.")
        lines.append("")
    lines += ["Re-checked by `tests/bench/test_sweep_example.py`: every stored statistic is recomputed from "
              "the stored decisions, the choice of model from the stored verdicts, and (slow) the first "
              "edits of each field run again on the example's model.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored measurement")
    parser.add_argument("--edits", type=int, default=None, help="only the first N values of each field")
    parser.add_argument("--model", default=None, help="the model to measure (default: the example's)")
    parser.add_argument("--doc", action="store_true", help=f"only write {DOC.name} from the stored file")
    args = parser.parse_args(argv)
    spec = json.loads(SPEC.read_text())
    if args.doc:
        DOC.write_text(markdown(spec, json.loads(MEASURED.read_text())))
        return 0
    if args.edits and not args.check:
        print("--edits without --check: a bounded sweep is not stored")
        return 2
    model = args.model or spec["model"]
    fresh = measure(spec, model, args.edits)
    if args.check:
        kept = json.loads(MEASURED.read_text())["models"].get(model)
        if kept is None:
            print(f"drift: {model} is not in {MEASURED.name}")
            return 1
        problems = differences(kept, fresh)
        for line in problems:
            print(line)
        checked = sum(len(f["edits"]) for f in fresh["fields"])
        print(f"{'drift' if problems else 'ok'}: {checked} edits checked")
        return 1 if problems else 0
    models = json.loads(MEASURED.read_text())["models"] if MEASURED.exists() else {}
    result = stored(spec, {**models, model: fresh})
    MEASURED.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    DOC.write_text(markdown(spec, result))
    for f in fresh["fields"]:
        print(f"{model}, {f['label']}: {f['edits_done']} edits in {f['seconds']} s; policy "
              f"{f['policy']['strategy']}: {f['policy']['sentence']}")
    print(f"the example runs on {result['model']}: {result['reason']}")
    if result["model"] != spec["model"]:
        print(f"{SPEC.name} names {spec['model']}: set its model to {result['model']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
