"""Sweeps that decide (issue 31): the same edits of the 1,040-token shipment log
(`examples/shipment-log.json`, its destination Oslo set to one port per edit) through both sweep paths,
side by side in one run on one loaded model, written to `docs/sweeps.md`:

- today's per-edit path: every edit timed in paired rounds (`run_sweep(..., timed_edits=N)`);
- the decision-only path: every edit deciding only, untimed, the reference computed exactly from
  the field on (`timed_edits=0`), with `stop_when_decided` off, then on.

Each edit's wall time is divided by one prefill of the document, measured in the same run (the
median of prefills taken before, between and after the paths), so the ratio holds on a loaded
machine where absolute times do not. Each path is a sweep of its own: its notes are prefilled
before it, outside its edits' walls, so its first edit pays what a sweep pays once (hoist's layout
of the document) and the later ones what every edit pays.

The values and the choices agree as `kvnotes sweep` requires: by default the question is a yes/no
one ("Is this shipment going to Oslo?"), whose choices name no port, so every port is a value it
can decide on; with `--choices` naming ports, a value the choices do not name stops the run (exit 2,
as the CLI does) unless `--extend-choices` adds the values to the choices, as the CLI and the API do.

    .venv/bin/python bench/bench_sweep.py [--per-edit 5] [--edits 200] [--question Q --choices a,b]
        [--extend-choices] [--values v1,v2,…] [--model smollm2-135m] [--out docs/sweeps.md]

A short run that finishes in minutes: `--per-edit 1 --edits 6`. The full one (the issue's):
`--per-edit 5 --edits 200`. Progress goes to stdout, one line an edit.
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
if str(ROOT) not in sys.path:
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
QUESTION = "Is this shipment going to Oslo?"
CHOICES = "yes,no"


def _load() -> float:
    return os.getloadavg()[0]


def _prefill_s(eng, document: str) -> float:
    t0 = time.perf_counter()
    eng.prefill(document)
    return time.perf_counter() - t0


def _path(eng, name: str, document: str, find: str, values, question, strategies, timed_edits: int,
          stop: bool, prefill_s: float) -> dict:
    """One sweep through `commands.sweep.run_sweep`, its notes prefilled first (outside the walls):
    per edit, its wall time (s) and the load average when it ended."""
    from commands.sweep import run_sweep

    notes = eng.prefill(document)
    walls: list[float] = []
    loads: list[float] = []
    forwards: list[list[int]] = []  # per edit: the inputs of each forward (batch × length)
    seen: list[int] = []
    last = [time.perf_counter()]
    started = time.perf_counter()
    hook = eng.model.register_forward_pre_hook(
        lambda module, a, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)

    def tick(done: int, total: int) -> None:
        walls.append(time.perf_counter() - last[0])
        loads.append(_load())
        forwards.append(list(seen))
        seen.clear()
        left = (time.perf_counter() - started) / done * (total - done)
        print(f"  {name}: edit {done} of {total}: {walls[-1]:.1f} s = {walls[-1] / prefill_s:.2f}× one "
              f"prefill (load {loads[-1]:.1f}; at most {left / 60:.0f} min left)", flush=True)
        last[0] = time.perf_counter()

    last[0] = time.perf_counter()
    try:
        result = run_sweep(eng, document, find, "destination", list(values), question, strategies,
                           progress=tick, stop_when_decided=stop, timed_edits=timed_edits, notes=notes)
    finally:
        hook.remove()
    return {"walls": walls, "loads": loads, "forwards": forwards, "result": result}


def run(args, question_text: str, choices: tuple[str, ...], values: list[str], extended: list[str]) -> dict:
    from data.settings import get_settings
    from vocabulary.sweeps import SWEEP_STRATEGIES
    from worker.engine import Question, load

    spec = json.loads((ROOT / "examples" / "shipment-log.json").read_text())
    document, find = spec["document"], spec["fields"][0]["find"]
    eng = load(args.model, data_dir=get_settings().data_dir)  # no KV store: every prefill is computed
    eng.warm_up()
    question = Question(question_text, choices=choices, max_new_tokens=8)
    strategies = list(SWEEP_STRATEGIES)
    loads = [_load()]
    prefills = [_prefill_s(eng, document) for _ in range(3)]
    print(f"prefill: {[round(p, 2) for p in prefills]} s (load {_load():.1f})", flush=True)
    one = statistics.median(prefills)
    print(f"per-edit path: {args.per_edit} edits, every one timed in paired rounds", flush=True)
    per = _path(eng, "per-edit", document, find, values[:args.per_edit], question, strategies, args.per_edit,
                False, one)
    prefills += [_prefill_s(eng, document) for _ in range(2)]
    one = statistics.median(prefills)
    print(f"decision-only path, stop_when_decided off: {len(values)} edits", flush=True)
    off = _path(eng, "decisions, stop off", document, find, values, question, strategies, 0, False, one)
    prefills += [_prefill_s(eng, document) for _ in range(2)]
    one = statistics.median(prefills)
    print(f"decision-only path, stop_when_decided on: up to {len(values)} edits", flush=True)
    on = _path(eng, "decisions, stop on", document, find, values, question, strategies, 0, True, one)
    prefills += [_prefill_s(eng, document) for _ in range(2)]
    loads += per["loads"] + off["loads"] + on["loads"] + [_load()]
    return {"model": args.model, "device": str(eng.device),
            "document_tokens": per["result"]["document_tokens"], "strategies": strategies,
            "question": question_text, "choices": list(choices),
            "extended_choices": extended, "values": values, "prefill_s": prefills, "loads": loads,
            "per_edit": per, "off": off, "on": on, "planned": len(values),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}


def _row(name: str, path: dict, prefill: float, tokens: int) -> str:
    walls, forwards = path["walls"], path["forwards"]
    later, calls = walls[1:] or walls, forwards[1:] or forwards
    return (f"| {name} | {len(walls)} | {statistics.median(walls):.2f} | "
            f"{statistics.median(walls) / prefill:.2f}× | {walls[0] / prefill:.2f}× | "
            f"{statistics.median(later) / prefill:.2f}× | {max(walls) / prefill:.2f}× | "
            f"{sum(walls) / len(walls) / prefill:.2f}× | {statistics.median(len(c) for c in calls):.0f} | "
            f"{statistics.median(sum(c) for c in calls) / tokens:.2f}× |")


def markdown(r: dict, command: str) -> str:
    prefill = statistics.median(r["prefill_s"])
    per, off, on = r["per_edit"], r["off"], r["on"]
    how = ("choices name no port, so every port is a value the question decides on"
           if not r["extended_choices"] else
           f"the choices extended with the {len(r['extended_choices'])} values they did not name, as "
           f"`kvnotes sweep --extend-choices` does")
    lines = [
        "# Sweeps that decide: one prefill's cost per edit",
        "",
        f"Written by `{command}` (bench/bench_sweep.py). The {r['document_tokens']}-token shipment log "
        f"(`examples/shipment-log.json`), its destination (Oslo) set to one port per edit, the question "
        f"\"{r['question']}\" (choices {', '.join(r['choices'])}: {how}), strategies "
        f"{', '.join(r['strategies'])}, on {r['model']} ({r['device']}, {r['machine']}). One prefill of the "
        f"document, measured in this run: median {prefill:.2f} s over {len(r['prefill_s'])} prefills taken "
        f"before, between and after the paths (range {min(r['prefill_s']):.2f}–{max(r['prefill_s']):.2f} s). "
        f"Load average (1 min) during the run: {min(r['loads']):.1f}–{max(r['loads']):.1f}.",
        "",
        "| path | edits | per edit, median (s) | per edit / one prefill | first edit / prefill "
        "| later edits, median / prefill | slowest / prefill | mean / prefill "
        "| forwards per later edit | inputs per later edit / document tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        _row("per-edit (every edit timed in paired rounds)", per, prefill, r["document_tokens"]),
        _row("decision-only, stop_when_decided off", off, prefill, r["document_tokens"]),
        _row("decision-only, stop_when_decided on", on, prefill, r["document_tokens"]),
        "",
        "The last two columns are counted by a hook on the model's forward in this run: how many "
        "forwards a later edit made, and how many inputs they took (a batched forward's batch × length, "
        "padding included) against the document's tokens, which is what one prefill takes in one forward.",
        "",
        "The goal is at most 2.0× one prefill per decision-only edit. Each path is a sweep of its own: its "
        "first edit also lays out hoist's document once (kept with the notes for the later edits) and "
        "reads stale's answer once (the same old notes every edit); the later edits' median is what each "
        "further edit costs. The decision-only paths time no edit (`timed_edits=0`); a sweep's timed edits "
        "cost what the per-edit path's edits cost.",
        "",
    ]
    for name, path in (("off", off), ("on", on)):
        res = path["result"]
        lines.append(f"- stop_when_decided {name}: {res['edits_done']} of {r['planned']} planned edits done"
                     f" ({res['stopped']}); policy **{res['policy']['strategy']}**; "
                     f"{res['policy']['sentence']}")
    pairs = list(zip(per["result"]["edits"], off["result"]["edits"]))
    same = sum(a["decisions"] == b["decisions"] for a, b in pairs)
    lines += ["", f"Decisions: {same} of the {len(pairs)} edits both paths ran were decided the same by "
              "every strategy on the per-edit and the decision-only path."]
    lines += ["", "## What the decision-only sweep found (stop_when_decided off)", "",
              "| strategy | agreement | changed edits | cost share |", "|---|---:|---:|---:|"]
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
    parser.add_argument("--edits", type=int, default=200, help="edits through the decision-only paths")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--choices", default=CHOICES, help="comma-separated ('' for a free answer)")
    parser.add_argument("--extend-choices", action="store_true",
                        help="add the values the choices do not name to them (else such a value exits 2)")
    parser.add_argument("--values", default=None, help="comma-separated ports (default: the first --edits "
                                                       "of 200 ports)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "sweeps.md"))
    parser.add_argument("--json", default=str(ROOT / "bench" / "data" / "sweeps.json"))
    parser.add_argument("--case", default="yesno", choices=["yesno", "free", "choices13", "held-out"],
                        help="yesno: the shipment log (above); free / choices13 / held-out (both): issue "
                             "42's cases on a held-out record (bench/sweep_cases.py), a section of --out")
    parser.add_argument("--check", type=int, default=1,
                        help="held-out cases: values checked against a timed run")
    args = parser.parse_args(argv)
    if args.case != "yesno":
        return held_out(args, argv)
    from commands.sweep import SweepUsageError, checked_choices

    values = [v.strip() for v in args.values.split(",") if v.strip()] if args.values else list(PORTS)
    if not 1 <= args.edits <= len(values) or not 1 <= args.per_edit <= args.edits:
        parser.error(f"need 1 <= --per-edit <= --edits <= {len(values)} (the values)")
    values = values[:args.edits]
    choices = tuple(c.strip() for c in args.choices.split(",") if c.strip())
    try:
        extended = checked_choices(values, choices, "Oslo", args.extend_choices)
    except SweepUsageError as exc:
        print(f"bench_sweep: {exc}", file=sys.stderr)
        return 2
    result = run(args, args.question, (*choices, *extended), values, extended)
    command = "bench/bench_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    text = markdown(result, command.strip())
    Path(args.out).write_text(text)
    print(text)
    return 0


HELD_OUT = "## Held-out cases: a free answer and 13 choices (issue 42)"


def held_out(args, argv: list[str] | None) -> int:
    """Issue 42's cases, each alone in this process, written as a section of `args.out` (replacing
    the section of an earlier run, the rest of the file kept)."""
    from bench.sweep_cases import markdown as cases_markdown
    from bench.sweep_cases import run_case

    names = ["free", "choices13"] if args.case == "held-out" else [args.case]
    results = [run_case(name, args.edits, args.check) for name in names]
    command = "bench/bench_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.json).with_name("sweeps-held-out.json").write_text(json.dumps(results, indent=1, default=str))
    section = "\n".join([HELD_OUT, "", f"Written by `{command.strip()}` (bench/sweep_cases.py), "
                         f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
                         cases_markdown(results), ""])
    out = Path(args.out)
    text = out.read_text() if out.exists() else ""
    head = text.split(HELD_OUT)[0].rstrip("\n")
    out.write_text((head + "\n\n" if head else "") + section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
