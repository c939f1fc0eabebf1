"""Run each bundled example on its model and store what it measured, so an example's description
quotes numbers that were measured, never typed: `examples/<slug>.measured.json`.

    .venv/bin/python scripts/measure_examples.py [SLUG ...]          # write the measurements
    .venv/bin/python scripts/measure_examples.py --check [SLUG ...]  # run again, compare, exit 1 on drift

Each strategy's entry: `answer` (the generated text, else the chosen choice), `same_decision` (the
run page's "same decision as recompute"), `answer_f1`, `kl` (first answer token, against
recompute) and `edit_followed` (new | old | both | neither). The run is the app's: the example's
document, fields, skills spliced where the example places them, its question, every strategy.
`--check` runs only recompute and the strategies a description cites, and allows KL and F1 to move
by `TOLERANCE` (greedy decoding on one machine repeats exactly; another CPU may round differently).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.web.notebooks.examples import ExampleSpec, cited, example_slugs, measured_path, read_spec  # noqa: E402
from data.settings import get_settings  # noqa: E402
from vocabulary import STRATEGIES  # noqa: E402

TOLERANCE = {"kl": 0.02, "answer_f1": 0.05}  # absolute


def measure(spec: ExampleSpec, strategies: tuple[str, ...] = STRATEGIES) -> dict:
    """The example run on its model: one entry per strategy."""
    from worker.engine import Field, Placement, Question, RunRequest, load

    eng = load(spec.model, data_dir=get_settings().data_dir)
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
    return {"example": spec.slug, "model": spec.model, "written_by": "scripts/measure_examples.py",
            "strategies": rows}


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
    args = parser.parse_args(argv)
    slugs = args.slugs or example_slugs()
    drift = []
    for slug in slugs:
        spec = read_spec(slug)
        path = measured_path(slug)
        if args.check:
            named = {s for s, _ in cited(spec.description)}
            fresh = measure(spec, tuple(s for s in STRATEGIES if s == "recompute" or s in named))
            found = differences(json.loads(path.read_text(encoding="utf-8")), fresh)
            drift += [f"{slug}: {d}" for d in found]
            print(f"{slug}: {'drifted' if found else 'as stored'} ({len(fresh['strategies'])} strategies)")
        else:
            path.write_text(json.dumps(measure(spec), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            print(f"{slug}: wrote {path.relative_to(ROOT)}")
    for line in drift:
        print(line, file=sys.stderr)
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
