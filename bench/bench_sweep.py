"""A sweep against single runs (issue 23): N destinations of the ~1,000-token shipment log
(`examples/shipment-log.json`), every strategy against recompute on each, run two ways on the same
loaded model, and written side by side to `docs/sweeps.md`:

- the sweep: `kvnotes sweep`'s loop (`commands.sweep.run_sweep`), the document prefilled once and
  every edit starting from those notes;
- N single runs: what N separate runs of the notebook do, each prefilling the document again.

    .venv/bin/python bench/bench_sweep.py [--edits 40] [--model smollm2-135m] [--out docs/sweeps.md]

Wall time per edit is measured around each whole edit (prefill included where there is one); the
statistics are the sweep's own (`vocabulary.sweeps`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CITIES = ["Madrid", "Lisbon", "Rotterdam", "Hamburg", "Gdansk", "Tallinn", "Riga", "Helsinki",
          "Stockholm", "Copenhagen", "Aarhus", "Bergen", "Trondheim", "Tromso", "Reykjavik", "Dublin",
          "Cork", "Liverpool", "Antwerp", "Le Havre", "Marseille", "Genoa", "Naples", "Valencia",
          "Barcelona", "Piraeus", "Izmir", "Constanta", "Varna", "Trieste", "Koper", "Split",
          "Bremen", "Kiel", "Malmo", "Gothenburg", "Stavanger", "Aberdeen", "Hull", "Zeebrugge"]
STRATEGIES = ["recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum"]
QUESTION = "What is the destination of this shipment?"


class _Budgeted(list):
    """The values, handed out while the time budget lasts: the sweep stops between edits once it is
    spent, and its statistics cover the edits done (the markdown says how many)."""

    def __init__(self, values: list[str], budget_s: float | None) -> None:
        super().__init__(values)
        self.deadline = None if budget_s is None else time.monotonic() + budget_s

    def __iter__(self):
        for value in list.__iter__(self):
            if self.deadline is not None and time.monotonic() > self.deadline:
                return
            yield value


def run(edits: int, model: str, max_new_tokens: int, budget_s: float | None = None) -> dict:
    from commands.sweep import run_sweep
    from data.settings import get_settings
    from worker.engine import Field, Question, RunRequest, load

    spec = json.loads((ROOT / "examples" / "shipment-log.json").read_text())
    document, find = spec["document"], spec["fields"][0]["find"]
    start = document.index(find)
    eng = load(model, data_dir=get_settings().data_dir)  # no KV store: a single run's prefill is computed
    question = Question(QUESTION, max_new_tokens=max_new_tokens)
    values = _Budgeted(CITIES[:edits], budget_s)
    eng.warm_up()

    # Interleaved: after each sweep edit (its progress callback), the single run of the same value,
    # so both columns see the same machine load; each is timed on its own.
    sweep_times: list[float] = []
    single_times: list[float] = []
    single_prefills = 0
    loads: list[float] = []
    last = [time.perf_counter()]

    def single(value: str) -> None:
        request = RunRequest(document=document, question=question, strategies=tuple(STRATEGIES),
                             fields=(Field(start, start + len(find), value, "destination"),))
        t1 = time.perf_counter()
        eng.run(request)  # notes=None: the run prefills the document itself
        single_times.append(time.perf_counter() - t1)

    def tick(done: int, total: int) -> None:
        nonlocal single_prefills
        sweep_times.append(time.perf_counter() - last[0])
        loads.append(os.getloadavg()[0])
        single(values[done - 1])
        single_prefills += 1
        print(f"edit {done}/{total}: sweep {sweep_times[-1]:.1f} s, single {single_times[-1]:.1f} s, "
              f"load {loads[-1]:.1f}", flush=True)
        last[0] = time.perf_counter()

    sweep = run_sweep(eng, document, find, "destination", values, question, STRATEGIES, progress=tick)
    sweep_total = sum(sweep_times)
    return {"model": model, "device": str(eng.device), "edits": len(sweep_times), "planned": len(values),
            "document_tokens": sweep["document_tokens"], "sweep": sweep, "sweep_total_s": sweep_total,
            "sweep_per_edit_s": sweep_times, "single_total_s": sum(single_times),
            "single_per_edit_s": single_times, "single_prefills": single_prefills,
            "load_average": [min(loads, default=0.0), max(loads, default=0.0)],
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}"}


def paired(sweep: list[float], single: list[float]) -> str:
    """The per-edit saving read pair by pair (single run minus sweep edit, same value, back to back):
    its median, interquartile range and how often the sweep edit was the faster."""
    diffs = [b - a for a, b in zip(sweep, single)]
    if len(diffs) < 2:
        return f"Paired saving per edit: {diffs[0]:.1f} s (one pair)." if diffs else ""
    q1, med, q3 = statistics.quantiles(diffs, n=4)
    noise = " The range crosses 0: the saving is within the timing noise here." if q1 < 0 < q3 else ""
    return (f"Paired saving per edit (single run minus sweep edit, same value, back to back): median "
            f"{med:.1f} s, interquartile range [{q1:.1f}, {q3:.1f}] s; the sweep edit was the faster in "
            f"{sum(d > 0 for d in diffs)} of {len(diffs)} pairs.{noise}")


def markdown(r: dict, command: str) -> str:
    s = r["sweep"]
    sw, si = r["sweep_per_edit_s"], r["single_per_edit_s"]
    lines = [
        "# Sweeps: one prefill for many edits",
        "",
        f"Written by `{command}` (bench/bench_sweep.py). {r['edits']} destinations of the "
        f"{r['document_tokens']}-token shipment log (`examples/shipment-log.json`), every strategy against "
        f"recompute on each, the question \"{QUESTION}\" (free answer), on {r['model']} ({r['device']}).",
        "",
        "| | edits | document prefills | total (s) | per edit, median (s) | per edit, max (s) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| sweep | {r['edits']} | {s['document_prefills']} | {r['sweep_total_s']:.1f} | "
        f"{statistics.median(sw):.2f} | {max(sw):.2f} |",
        f"| {r['edits']} single runs | {r['edits']} | {r['single_prefills']} | {r['single_total_s']:.1f} | "
        f"{statistics.median(si):.2f} | {max(si):.2f} |",
        "",
        f"The sweep's cost per edit is {r['sweep_total_s'] / r['edits']:.2f} s against "
        f"{r['single_total_s'] / r['edits']:.2f} s for a single run "
        f"({'at most' if r['sweep_total_s'] <= r['single_total_s'] else 'MORE than'} a single run's), and "
        f"the document was prefilled {s['document_prefills']} time(s) instead of {r['single_prefills']}.",
        "",
        paired(sw, si),
        "",
        "Each sweep edit was followed at once by the single run of the same value (interleaved), so "
        f"both columns ran under the same machine load (load average {r['load_average'][0]:.1f} to "
        f"{r['load_average'][1]:.1f} on {os.cpu_count()} cores).",
        "",
        "## What the sweep found",
        "",
        "| strategy | agreement | 95% interval | changed edits | 95% interval | cost share |",
        "|---|---:|---|---:|---|---:|",
    ]
    for name, st in s["strategies"].items():
        ci = st["agreement_ci95"] or [0, 0]
        ch = st["changed"]
        cci = ch["ci95"] or [0, 0]
        lines.append(f"| {name} | {st['agreed']}/{st['determined']} | [{ci[0]:.2f}, {ci[1]:.2f}] | "
                     f"{ch['agreed']}/{ch['edits']} | [{cci[0]:.2f}, {cci[1]:.2f}] | "
                     f"{(st['cost_share'] or 0):.1%} |")
    lines += ["", f"Policy at {s['policy']['threshold']:.2f}: **{s['policy']['strategy']}**: "
              f"{s['policy']['sentence']}.", ""]
    if r["edits"] < 40:
        lines += [f"Bounded run: {r['edits']} of the {r['planned']} planned edits (of 40), on a shared "
                  "2-core machine. The full benchmark is "
                  "`.venv/bin/python bench/bench_sweep.py --edits 40`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=40, choices=range(1, len(CITIES) + 1), metavar="1..40")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop between edits once this many seconds have passed (the table says "
                        "how many ran)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "sweeps.md"))
    args = parser.parse_args(argv)
    result = run(args.edits, args.model, args.max_new_tokens, args.budget_s)
    command = "bench/bench_sweep.py" + (f" --edits {args.edits}" if args.edits != 40 else "") + (
        f" --budget-s {args.budget_s:g}" if args.budget_s else "")
    Path(args.out).write_text(markdown(result, command))
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
