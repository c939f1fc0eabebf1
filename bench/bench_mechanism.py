"""The mechanism views on the bundled model (issue 27): knockout, selective@K with K*, the logit
lens, and what each costs, on the examples with a choice question. Prints the markdown that
docs/verdicts.md quotes. `python bench/bench_mechanism.py [example.json ...]`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.engine import Field, Question, load  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ["recompute", "stale", "in_place", "field_erratum", "selective"]


def one(eng, path: Path) -> str:
    ex = json.loads(path.read_text())
    document, f = ex["document"], ex["fields"][0]
    start = document.index(f["find"])
    question = Question(ex["question"], tuple(ex.get("choices") or ()))
    field = Field(start, start + len(f["find"]), f["new_value"], f.get("label", ""))
    stages: dict[str, float] = {}

    def progress(stage: str, _fraction: float) -> None:
        key = stage.split(":")[0] if stage.startswith("attention") else stage
        stages.setdefault(key, time.perf_counter())

    report = eng.edit(document, [field], question, attribution=True, mechanism=True, strategies=STRATEGIES,
                      progress=progress)
    m = report.mechanism
    t0, t1 = stages["prefill"], stages["notes map"]
    t_map = stages["mechanism: knockout"] - t1
    t2 = stages.get("attention", stages["done"]) - stages["mechanism: knockout"]
    lines = [
        f"### `{path.name}` ({report.document_tokens} document tokens)",
        "",
        f"Recompute's answer token `{m.answer.strip()}`, decision **{m.decision.strip()}**; knockout beside "
        f"recompute: **{m.shown}**. Prefill and the {len(STRATEGIES)} strategies (timed repeatedly) took "
        f"{t1 - t0:.1f} s, the notes map {t_map:.1f} s, the three views {t2:.1f} s; their cost in "
        f"recomputes (tokens run through the model): "
        + ", ".join(f"{k} {v:.2f}" for k, v in m.costs.items())
        + ".",
        "",
        "| strategy | region | layers | size | decision | p(answer) | KL | control p (± sd) | control KL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in m.unmasked.items():
        lines.append(
            f"| {name} | nothing | — | 0 | {r.decision.strip()} | {r.p_answer:.3f} | {r.kl:.4f} | | |"
        )
    for row in m.knockout:
        if row.reading is None:
            lines.append(
                f"| {row.strategy} | {row.region} | {row.layers} | {row.size} | {row.note} | | | | |"
            )
            continue
        c = row.control
        lines.append(
            f"| {row.strategy} | {row.region} | {row.layers} | {row.size} | {row.reading.decision.strip()} "
            f"| {row.reading.p_answer:.3f} | {row.reading.kl:.4f} "
            f"| {c.p_answer:.3f} ± {c.p_answer_spread:.3f} | {c.kl:.4f} |"
        )
    lines += [
        "",
        f"Selective@K over {m.downstream} downstream tokens (agreement with recompute's decision, KL):",
        "",
        "| ranking | K* | " + " | ".join(f"K={p.k}" for p in m.selective_k[1].points) + " |",
        "| --- | --- | " + " | ".join("---" for _ in m.selective_k[1].points) + " |",
    ]
    for c in m.selective_k:
        cells = [f"{'✓' if p.agrees else '✗'} {p.reading.kl:.3f}" for p in c.points]
        lines.append(
            f"| {c.ranking} | {c.k_star if c.k_star is not None else 'none'} | " + " | ".join(cells) + " |"
        )
    lines += ["", "Logit lens, p(recompute's answer token) at layers 1, 10, 20, 25, 28, 30:", ""]
    for name, ps in m.logit_lens.items():
        pick = [ps[i] for i in (0, 9, 19, 24, 27, len(ps) - 1) if i < len(ps)]
        lines.append(f"- {name}: " + " · ".join(f"{p:.3f}" for p in pick))
    lines += [""] + [f"- note: {n}" for n in m.notes]
    return "\n".join(lines)


def main() -> None:
    eng = load("smollm2-135m")
    paths = [Path(a) for a in sys.argv[1:]] or [
        ROOT / "examples" / "shipment-log.json",
        ROOT / "examples" / "access-policy.json",
    ]
    for p in paths:
        print(one(eng, p), flush=True)
        print()


if __name__ == "__main__":
    main()
