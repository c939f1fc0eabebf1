"""Sweeps that decide (issue 31): the same edits of the ~1,000-token shipment log
(`examples/shipment-log.json`) through both sweep paths, side by side in one run on one loaded model,
written to `docs/sweeps.md`:

- today's per-edit path: every edit timed in paired rounds (`run_sweep(..., timed_edits=N)`);
- the decision-only path: every edit deciding only, untimed, the reference computed exactly from
  the field on (`timed_edits=0`: a timed edit costs what a per-edit path's edit costs, measured
  above), with `stop_when_decided` off, then on.

Each edit's wall time is divided by one prefill of the document, measured in the same run (the
median of prefills taken before, between and after the paths), so the ratio holds on a loaded
machine where absolute times do not.

    .venv/bin/python bench/bench_sweep.py [--per-edit 5] [--edits 200] [--budget-s S] \\
        [--choices Oslo,Madrid] [--model smollm2-135m] [--out docs/sweeps.md]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# 200 destinations, none of them the old one (Oslo)
PORTS = (
    "Madrid Lisbon Rotterdam Hamburg Gdansk Tallinn Riga Helsinki Stockholm Copenhagen Aarhus Bergen "
    "Trondheim Tromso Reykjavik Dublin Cork Liverpool Antwerp Marseille Genoa Naples Valencia Barcelona "
    "Piraeus Izmir Constanta Varna Trieste Koper Split Bremen Kiel Malmo Gothenburg Stavanger Aberdeen "
    "Hull Zeebrugge Dunkirk Calais Bordeaux Nantes Brest Bilbao Vigo Porto Seville Malaga Cadiz "
    "Palermo Catania Bari Venice Ancona Livorno Rijeka Zadar Dubrovnik Bar Durres Thessaloniki Patras "
    "Heraklion Limassol Haifa Ashdod Alexandria Tunis Algiers Oran Tangier Casablanca Agadir Dakar "
    "Abidjan Accra Lagos Luanda Walvis Cape Durban Maputo Mombasa Djibouti Jeddah Aqaba Dubai Doha "
    "Muscat Karachi Mumbai Chennai Colombo Chittagong Yangon Bangkok Singapore Jakarta Surabaya Manila "
    "Saigon Haiphong Hongkong Shenzhen Xiamen Ningbo Shanghai Qingdao Tianjin Dalian Busan Incheon "
    "Kobe Osaka Nagoya Yokohama Tokyo Sapporo Vladivostok Magadan Anchorage Vancouver Seattle Portland "
    "Oakland Stockton Sacramento Fresno Monterey Honolulu Suva Apia Noumea Brisbane Sydney Melbourne "
    "Adelaide Fremantle Darwin Hobart Auckland Wellington Lyttelton Dunedin Valparaiso Callao "
    "Guayaquil Balboa Cartagena Barranquilla Maracaibo Caracas Georgetown Paramaribo Cayenne Belem "
    "Fortaleza Recife Salvador Vitoria Santos Paranagua Itajai Montevideo Rosario Ushuaia Havana "
    "Kingston Nassau Miami Tampa Mobile Houston Galveston Corpus Veracruz Tampico Progreso Charleston "
    "Savannah Norfolk Baltimore Philadelphia Newark Boston Halifax Quebec Montreal Toronto Duluth "
    "Chicago Detroit Cleveland Buffalo Nuuk Torshavn Lerwick Kirkwall Narvik Murmansk Arkhangelsk"
).split()
QUESTION = "What is the destination of this shipment?"


def _prefill_s(eng, document: str) -> float:
    t0 = time.perf_counter()
    eng.prefill(document)
    return time.perf_counter() - t0


def _path(eng, document, find, values, question, strategies, timed_edits, stop, budget_s):
    """One sweep through `commands.sweep.run_sweep`: per edit, its wall time (s)."""
    from commands.sweep import run_sweep

    walls: list[float] = []
    last = [time.perf_counter()]
    deadline = None if budget_s is None else time.monotonic() + budget_s

    class Budgeted(list):  # the values, handed out while the budget lasts
        def __iter__(self):
            for value in list.__iter__(self):
                if deadline is not None and time.monotonic() > deadline:
                    return
                yield value

    def tick(done: int, total: int) -> None:
        walls.append(time.perf_counter() - last[0])
        print(f"  edit {done}: {walls[-1]:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
        last[0] = time.perf_counter()

    kwargs = {"timed_edits": timed_edits}
    if "stop_when_decided" in inspect.signature(run_sweep).parameters:
        kwargs["stop_when_decided"] = stop
    elif stop:
        return None  # stop_when_decided has not landed: the bench says so
    eng.prefill(document)  # the sweep's own prefill is outside the per-edit walls
    last[0] = time.perf_counter()
    result = run_sweep(eng, document, find, "destination", Budgeted(values), question, strategies,
                       progress=tick, **kwargs)
    return {"walls": walls, "result": result}


def run(per_edit: int, edits: int, model: str, choices: tuple[str, ...], budget_s: float | None) -> dict:
    from data.settings import get_settings
    from vocabulary.sweeps import SWEEP_STRATEGIES
    from worker.engine import Question, load

    spec = json.loads((ROOT / "examples" / "shipment-log.json").read_text())
    document, find = spec["document"], spec["fields"][0]["find"]
    eng = load(model, data_dir=get_settings().data_dir)  # no KV store: every prefill is computed
    eng.warm_up()
    question = Question(QUESTION, choices=choices, max_new_tokens=8)
    strategies = list(SWEEP_STRATEGIES)
    prefills = [_prefill_s(eng, document) for _ in range(3)]
    print(f"prefill: {[round(p, 2) for p in prefills]} s", flush=True)
    budget = None if budget_s is None else budget_s / 3
    print("per-edit path", flush=True)
    per = _path(eng, document, find, PORTS[:per_edit], question, strategies, per_edit, False, budget)
    prefills += [_prefill_s(eng, document) for _ in range(2)]
    print("decision-only path, stop_when_decided off", flush=True)
    off = _path(eng, document, find, PORTS[:edits], question, strategies, 0, False, budget)
    prefills += [_prefill_s(eng, document) for _ in range(2)]
    print("decision-only path, stop_when_decided on", flush=True)
    on = _path(eng, document, find, PORTS[:edits], question, strategies, 0, True, budget)
    prefills += [_prefill_s(eng, document) for _ in range(2)]
    return {"model": model, "device": str(eng.device), "document_tokens": per["result"]["document_tokens"],
            "strategies": strategies, "choices": list(choices), "prefill_s": prefills,
            "per_edit": per, "off": off, "on": on, "planned": edits,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}


def _row(name: str, path: dict | None, prefill: float, untimed_only: bool) -> str:
    if path is None:
        return f"| {name} | not run: `stop_when_decided` is not in `run_sweep` yet | | | |"
    walls = path["walls"]
    med = statistics.median(walls)
    return (f"| {name} | {len(path['walls'])} | {med:.2f} | {med / prefill:.2f}× | "
            f"{max(walls) / prefill:.2f}× |")


def markdown(r: dict, command: str) -> str:
    prefill = statistics.median(r["prefill_s"])
    per, off, on = r["per_edit"], r["off"], r["on"]
    choices = f"choices {', '.join(r['choices'])}" if r["choices"] else "free answer, 8 new tokens"
    lines = [
        "# Sweeps that decide: one prefill's cost per edit",
        "",
        f"Written by `{command}` (bench/bench_sweep.py). The {r['document_tokens']}-token shipment log "
        f"(`examples/shipment-log.json`), its destination set to one port per edit, the question "
        f"\"{QUESTION}\" ({choices}), strategies {', '.join(r['strategies'])}, on {r['model']} "
        f"({r['device']}, {r['machine']}). One prefill of the document, measured in this run: median "
        f"{prefill:.2f} s over {len(r['prefill_s'])} prefills taken before, between and after the paths "
        f"(range {min(r['prefill_s']):.2f}–{max(r['prefill_s']):.2f} s).",
        "",
        "| path | edits | per edit, median (s) | per edit / one prefill | slowest edit / one prefill |",
        "|---|---:|---:|---:|---:|",
        _row("per-edit (every edit timed in paired rounds)", per, prefill, False),
        _row("decision-only, stop_when_decided off (untimed edits)", off, prefill, True),
        _row("decision-only, stop_when_decided on (untimed edits)", on, prefill, True),
        "",
        "The goal is at most 2.0× one prefill per decision-only edit. The decision-only paths time no "
        "edit (`timed_edits=0`); a sweep's timed edits cost what the per-edit path's edits cost.",
        "",
    ]
    for name, path in (("off", off), ("on", on)):
        if path is None:
            continue
        res = path["result"]
        lines.append(f"- stop_when_decided {name}: {res['edits_done']} of {r['planned']} planned edits done"
                     f" ({res.get('stopped', 'exhausted')}); policy **{res['policy']['strategy']}**; "
                     f"{res['policy']['sentence']}")
    if on is None:
        lines.append("- stop_when_decided on: not run (not in `run_sweep` when this ran).")
    if off is not None and per is not None:
        lines += ["", "Decisions of the edits both paths ran (the per-edit path's are the reference):", ""]
        same = sum(a["decisions"] == b["decisions"] for a, b in zip(per["result"]["edits"],
                                                                   off["result"]["edits"]))
        lines.append(f"{same} of {min(len(per['result']['edits']), len(off['result']['edits']))} edits "
                     "decided the same for every strategy on both paths.")
    lines += ["", "## What the decision-only sweep found (stop_when_decided off)", "",
              "| strategy | agreement | changed edits | cost share |", "|---|---:|---:|---:|"]
    if off is not None:
        for name, st in off["result"]["strategies"].items():
            ch = st["changed"]
            lines.append(f"| {name} | {st['agreed']}/{st['determined']} | {ch['agreed']}/{ch['edits']} | "
                         f"{(st['cost_share'] or 0):.1%} |")
        lines += ["", f"Policy at {off['result']['policy']['threshold']:.2f}: "
                  f"**{off['result']['policy']['strategy']}**: {off['result']['policy']['sentence']}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-edit", type=int, default=5, help="edits through today's per-edit path")
    parser.add_argument("--edits", type=int, default=200, choices=range(1, len(PORTS) + 1), metavar="1..200")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--choices", default="", help="comma-separated (default: a free answer)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the three paths share this many seconds; each stops between edits")
    parser.add_argument("--out", default=str(ROOT / "docs" / "sweeps.md"))
    parser.add_argument("--json", default=str(ROOT / "bench" / "data" / "sweeps.json"))
    args = parser.parse_args(argv)
    choices = tuple(c.strip() for c in args.choices.split(",") if c.strip())
    result = run(args.per_edit, args.edits, args.model, choices, args.budget_s)
    command = "bench/bench_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    Path(args.out).write_text(markdown(result, command.strip()))
    print(markdown(result, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
