"""Verdicts on the bundled model: how often each strategy gives recompute's answer on held-out
read-back cases (normalised match, token F1, NLL of recompute's answer, TTFT speed-up), what the
notes map costs against a full recompute, and what each bundled example shows.

    .venv/bin/python bench/bench_verdicts.py --model smollm2-135m [--cases 12] [--out docs/verdicts.md]

Prints markdown tables; with --out, writes them between the `bench:verdicts` markers of that file.
The read-back cases are generated here (fixed seed) and are not the bundled examples.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from data.settings import get_settings  # noqa: E402
from vocabulary import STRATEGIES  # noqa: E402
from worker.engine import Field, Placement, Question, RunRequest, load  # noqa: E402
from worker.engine.attribution import notes_map  # noqa: E402
from worker.engine.edit import Editor  # noqa: E402
from worker.engine.strategies.edits.in_place import in_place  # noqa: E402
from worker.engine.strategies.edits.recompute import recompute as recomputed  # noqa: E402
from worker.engine.strategies.edits.stale import stale  # noqa: E402

FIELDS = [  # label, old value, new value
    ("status", "active", "suspended"), ("city", "Lisbon", "Warsaw"), ("plan", "basic", "premium"),
    ("owner", "Dana Lee", "Omar Haddad"), ("colour", "green", "purple"), ("tier", "silver", "gold"),
    ("region", "north", "south"), ("contact", "email", "phone"), ("priority", "low", "urgent"),
    ("currency", "euro", "yen"), ("carrier", "NordFreight", "BlueLine"), ("language", "French", "Korean"),
]
FILLER = ["The record was reviewed by the operations team.", "No complaints were filed this quarter.",
          "Invoices are issued within three days.", "The account was opened two years ago.",
          "Support answers within a day.", "Backups run every night."]


def read_back_cases(n: int, seed: int = 7) -> list[tuple[str, Field, Question]]:
    """`n` records where one field changes and the question reads it back (free answer)."""
    rng = random.Random(seed)
    cases = []
    for label, old, new in FIELDS[:n]:
        others = rng.sample([f for f in FIELDS if f[0] != label], 3)
        lines = [f"{lab}: {val}" for lab, val, _ in others] + [f"{label}: {old}"]
        rng.shuffle(lines)
        document = "Customer record\n" + "\n".join(lines) + "\n\n" + " ".join(rng.sample(FILLER, 4)) + "\n"
        start = document.index(f"{label}: {old}") + len(label) + 2
        cases.append((document, Field(start, start + len(old), new, label),
                      Question(f"What is the {label}?", max_new_tokens=12)))
    return cases


def agreement_table(eng, cases) -> str:
    rows: dict[str, dict[str, list[float]]] = {s: {"same": [], "f1": [], "nll": [], "speed": []}
                                               for s in STRATEGIES}
    ref_nll = []
    for document, field, question in cases:
        report = eng.run(RunRequest(document, question, fields=(field,)))
        rec = report.strategies["recompute"]
        ref_nll.append(rec.recompute_answer_nll)
        for name, r in report.strategies.items():
            rows[name]["same"].append(float(r.decision_matches_recompute))
            rows[name]["f1"].append(r.answer_f1)
            rows[name]["nll"].append(r.recompute_answer_nll - rec.recompute_answer_nll)
            rows[name]["speed"].append(rec.ttft_ms / r.ttft_ms)
        print(f"  {field.label}: recompute {rec.decision!r}; stale {report.strategies['stale'].decision!r}; "
              f"erratum {report.strategies['erratum'].decision!r}", file=sys.stderr)
    out = [f"{len(cases)} held-out read-back cases (free answer, ~80 tokens each); recompute's own NLL: "
           f"median {statistics.median(ref_nll):.3f}.", "",
           "| strategy | same answer as recompute (normalised) | mean answer F1 "
           "| NLL of recompute's answer − recompute's own (median) | TTFT speed-up (median) |",
           "| --- | --- | --- | --- | --- |"]
    for name in STRATEGIES:
        r = rows[name]
        out.append(f"| `{name}` | {int(sum(r['same']))}/{len(r['same'])} | {statistics.mean(r['f1']):.2f} | "
                   f"{statistics.median(r['nll']):+.3f} | {statistics.median(r['speed']):.1f}× |")
    return "\n".join(out)


def notes_map_cost(eng, example: Path, repeats: int = 3) -> str:
    """The notes map's own cost (its batched readouts over the three caches a run already holds)
    against a full recompute of the edited document, medians of `repeats`, side by side."""
    ex = json.loads(example.read_text())
    document, f = ex["document"], ex["fields"][0]
    start = document.index(f["find"])
    question = Question(ex["question"], tuple(ex.get("choices") or ()))
    old = eng.prefill(document)
    new_text = document[:start] + f["new_value"] + document[start + len(f["find"]):]
    ids, offsets, segments = eng.tokenize_document(new_text)
    editor = Editor(eng.model, eng.rope, old, ids, segments, offsets)
    prompt = eng.encode(eng.frame.suffix(question))
    full_s, map_s = [], []
    notes_map(eng.model, eng.tokenizer, editor, recomputed(editor).layers, in_place(editor).layers,
              stale(editor).layers, prompt)  # warm-up: the first forward of each batch shape is slow
    for _ in range(repeats):
        t0 = time.perf_counter()
        full = recomputed(editor).layers
        t1 = time.perf_counter()
        m = notes_map(eng.model, eng.tokenizer, editor, full, in_place(editor).layers,
                      stale(editor).layers, prompt)
        t2 = time.perf_counter()
        full_s.append(t1 - t0)
        map_s.append(t2 - t1)
    recompute, mapping = statistics.median(full_s), statistics.median(map_s)
    fine = sum(1 for sp in m.spans if sp.end - sp.start <= 16)
    top = sorted(m.spans, key=lambda sp: sp.share, reverse=True)[:3]
    return "\n".join([
        f"`{example.name}`: {len(ids)} document tokens; {len(m.spans)} spans ({fine} of 16 tokens where a "
        f"patch moves at least 5% of the gap, 64 tokens elsewhere); medians of {repeats}, side by side.", "",
        "| what | time | in full recomputes |", "| --- | --- | --- |",
        f"| a full recompute of the edited document | {recompute:.2f} s | 1.00 |",
        f"| the notes map, given the run's recompute, in_place and stale notes | {mapping:.2f} s "
        f"| {mapping / recompute:.2f} |",
        f"| the notes map with its own recompute (`kvnotes attribute`) | {recompute + mapping:.2f} s "
        f"| {(recompute + mapping) / recompute:.2f} |", "",
        f"Field share {m.field_share:.1%} (KL stale {m.kl_stale:.4f} → in place {m.kl_in_place:.4f}); "
        "largest spans: "
        + "; ".join(f"{sp.share:.1%} `{' '.join(sp.text.split())[:30]}`" for sp in top) + ".",
    ])


def examples_table(eng, directory: Path) -> str:
    out = ["| example | question | recompute | stale | erratum | field_erratum | in_place |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted(directory.glob("*.json")):
        ex = json.loads(path.read_text())
        document = ex["document"]
        fields = tuple(Field(document.index(f["find"]),
                             document.index(f["find"]) + len(f["find"]), f["new_value"],
                             f.get("label", "")) for f in ex.get("fields", []))
        placements = tuple(Placement(s["text"], None if s.get("position_find") is None
                                     else document.index(s["position_find"]))
                           for s in ex.get("skills", []))
        question = Question(ex["question"], tuple(ex.get("choices") or ()),
                            bool(ex.get("cot")), max_new_tokens=16)
        r = eng.run(RunRequest(document, question, fields=fields, placements=placements,
                               strategies=("recompute", "stale", "erratum", "field_erratum",
                                           "in_place"))).strategies
        cell = {n: f"{r[n].decision[:40]!r}" + ("" if n == "recompute" else
                   f" {'✓' if r[n].decision_matches_recompute else '✗'} F1 {r[n].answer_f1:.2f}") for n in r}
        out.append(f"| `{path.stem}` | {ex['question']} | {cell['recompute']} | {cell['stale']} "
                   f"| {cell['erratum']} | {cell['field_erratum']} | {cell['in_place']} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    eng = load(args.model, device="cpu", data_dir=get_settings().data_dir)
    eng.warm_up()
    sections = [
        "### Read-back agreement\n\n" + agreement_table(eng, read_back_cases(args.cases)),
        "### What the notes map costs\n\n" + notes_map_cost(eng, ROOT / "examples" / "shipment-log.json"),
        "### The bundled examples\n\n" + examples_table(eng, ROOT / "examples"),
    ]
    text = f"Model `{args.model}`, CPU, torch {torch.__version__}.\n\n" + "\n\n".join(sections)
    print(text)
    if args.out is not None:
        doc = args.out.read_text()
        head, rest = doc.split("<!-- bench:verdicts -->", 1)
        _, tail = rest.split("<!-- /bench:verdicts -->", 1)
        args.out.write_text(f"{head}<!-- bench:verdicts -->\n{text}\n<!-- /bench:verdicts -->{tail}")


if __name__ == "__main__":
    main()
