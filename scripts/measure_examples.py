"""Run each bundled example on every bundled model and store what it measured, so an example's
description quotes numbers that were measured, never typed: `examples/<slug>.measured.json`.

    .venv/bin/python scripts/measure_examples.py [SLUG ...] [--models M,...]  # write the measurements
    .venv/bin/python scripts/measure_examples.py --check [SLUG ...]  # run again, compare, exit 1 on drift

The file keeps each model's run (`models`: {name: {strategies}}; measuring some models keeps the
others'), the model the example runs on (`model`: the first, in the settings' models list, whose
recompute names the field's new value while its stale notes keep the old one,
`vocabulary.readback.choose_model`) and the sentence that says why (`reason`, shown on the example's
card and page). The example's `model` must name that model: the script says so and exits 1 when not.

Each strategy's entry: `answer` (the generated text, else the chosen choice), `same_decision` (the
run page's "same decision as recompute"), `answer_f1`, `kl` (first answer token, against
recompute) and `edit_followed` (new | old | both | neither). The run is the app's: the example's
document, fields, skills spliced where the example places them, its question, every strategy.
`--check` runs only the example's model, recompute and the strategies a description cites (and
the stale notes, which the choice reads), and allows KL and F1 to move
by `TOLERANCE` (greedy decoding on one machine repeats exactly; another CPU may round differently).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.web.notebooks.examples import (  # noqa: E402
    ExampleSpec,
    chosen_model,
    cited,
    example_slugs,
    measured_path,
    read_spec,
)
from data.settings import get_settings  # noqa: E402
from vocabulary import STRATEGIES  # noqa: E402

TOLERANCE = {"kl": 0.02, "answer_f1": 0.05}  # absolute


def measure(spec: ExampleSpec, model: str, strategies: tuple[str, ...] = STRATEGIES) -> dict:
    """The example run on `model`: one entry per strategy."""
    from worker.engine import Field, Placement, Question, RunRequest, load

    eng = load(model, data_dir=get_settings().data_dir)
    request = RunRequest(
        document=spec.document,
        question=Question(spec.question, spec.choices, spec.cot),
        fields=tuple(Field(f.start, f.end, f.new_value, f.label) for f in spec.fields),
        strategies=strategies,
        placements=tuple(Placement(text=s.text, at=s.position) for s in spec.skills),
    )
    report = eng.run(request)
    rows = {}
    for name, r in report.strategies.items():
        rows[name] = {"answer": r.text or r.decision, "same_decision": bool(r.decision_matches_recompute),
                      "answer_f1": round(float(r.answer_f1), 4), "kl": round(float(r.kl_to_recompute), 5),
                      "edit_followed": r.edit_followed}
    return {"strategies": rows}


def stored(slug: str, models: dict[str, dict]) -> dict:
    """The measured file: every model's run (in the settings' order, the default first), the model
    chosen and why."""
    listed = get_settings().models
    order = [m for m in listed if m in models] + [m for m in models if m not in listed]
    ordered = {m: models[m] for m in order}
    model, reason = chosen_model(ordered)
    return {"example": slug, "written_by": "scripts/measure_examples.py", "model": model, "reason": reason,
            "models": ordered}


def differences(stored: dict, fresh: dict) -> list[str]:
    """What the fresh measurement says differently from the stored one (for the strategies it ran)."""
    out = []
    for name, row in fresh["strategies"].items():
        old = stored["strategies"].get(name)
        if old is None:
            out.append(f"{name}: not in the stored measurement")
            continue
        for key, value in row.items():
            if key in TOLERANCE:
                if abs(value - old[key]) > TOLERANCE[key]:
                    out.append(f"{name}.{key}: stored {old[key]}, measured {value}")
            elif value != old[key]:
                out.append(f"{name}.{key}: stored {old[key]!r}, measured {value!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slugs", nargs="*", help="examples to measure (default: every one)")
    parser.add_argument("--check", action="store_true",
                        help="measure again and compare with the stored files")
    parser.add_argument("--models", default=None,
                        help="comma-separated models to measure (default: every model the settings list)")
    args = parser.parse_args(argv)
    slugs = args.slugs or example_slugs()
    models = args.models.split(",") if args.models else get_settings().models
    drift = []
    for slug in slugs:
        spec = read_spec(slug)
        path = measured_path(slug)
        kept = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"models": {}}
        if args.check:
            named = {s for s, _ in cited(spec.description)} | {"stale"}
            fresh = measure(spec, spec.model, tuple(s for s in STRATEGIES if s == "recompute" or s in named))
            if kept.get("model") != spec.model or spec.model not in kept["models"]:
                found = [f"{path.name} chose {kept.get('model')!r}, {slug}.json names {spec.model!r}"]
            else:
                found = differences(kept["models"][spec.model], fresh)
            drift += [f"{slug}: {d}" for d in found]
            print(f"{slug}: {'drifted' if found else 'as stored'} on {spec.model} "
                  f"({len(fresh['strategies'])} strategies)")
            continue
        runs = dict(kept["models"])
        for model in models:
            runs[model] = measure(spec, model)
            print(f"{slug} on {model}: recompute {runs[model]['strategies']['recompute']['answer']!r}, "
                  f"stale {runs[model]['strategies']['stale']['answer']!r}", flush=True)
        result = stored(slug, runs)
        path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{slug}: wrote {path.relative_to(ROOT)}; {result['reason']}")
        if result["model"] != spec.model:
            drift.append(f"{slug}: the measurement chose {result['model']}, {slug}.json names {spec.model}: "
                         "set its model (and check its description)")
    for line in drift:
        print(line, file=sys.stderr)
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
