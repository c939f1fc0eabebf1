"""Where each strategy's decision attends, by region, on a bundled example run on its own model: the
numbers the README quotes under "Attention by region" (the run page's `attention_regions`, computed
the same way: `app.services.attention.region_shares` on the rows a worker stores).

    .venv/bin/python scripts/measure_attention_regions.py [SLUG] [--strategies recompute,erratum,…]

Prints one row per strategy: the share of the decision token's attention (mean over layers and
heads) on the sink, the document before the field, the field, the downstream notes, the errata,
the skills and the question.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from app.services.attention import REGIONS, region_shares
    from data.settings import get_settings
    from worker.engine import Field, Question, load
    from worker.mapping import result_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slug", nargs="?", default="shipment-log")
    parser.add_argument("--strategies", default="recompute,stale,erratum,field_erratum")
    args = parser.parse_args()
    example = json.loads((ROOT / "examples" / f"{args.slug}.json").read_text())
    document = example["document"]
    fields = []
    for f in example["fields"]:
        at = document.index(f["find"])
        fields.append(Field(at, at + len(f["find"]), f["new_value"], f.get("label", "")))
    eng = load(example["model"], device="cpu", data_dir=get_settings().data_dir)
    question = Question(example["question"], choices=tuple(example.get("choices") or ()))
    report = eng.edit(document, fields, question, strategies=args.strategies.split(","), attention=True)
    spans = [(f.start, f.end) for f in fields]
    print(f"{args.slug} on {example['model']}: decision attention by region (mean over layers and heads)")
    print(f"{'strategy':<14}" + "".join(f"{r:>13}" for r in REGIONS))
    for row in result_rows(0, report):
        if row.attention is None:
            continue
        shares = region_shares(row, spans).mean
        print(f"{row.strategy:<14}" + "".join(f"{shares[r]:>13.3f}" for r in REGIONS))


if __name__ == "__main__":
    main()
