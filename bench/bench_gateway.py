"""The paper's online experiment through the erratum gateway: the unmodified official `openai` client
pointed straight at vLLM, then at `kvnotes gateway --policy erratum` in front of the same server.

    scripts/vllm.sh --port 8100 &
    .venv/bin/python bench/bench_gateway.py --upstream http://127.0.0.1:8100/v1 --requests 48

The prompt is an agent's system message of about `--tokens` tokens (a shipment record and its log,
counted by the server) whose status line changes on every request, then the same user question.
Per arm (straight, gateway) and per arrival rate (Poisson at each of `--rates`, then saturation: all
requests at once): vLLM's own prefix-cache hit rate (its `/metrics` counters across the arm), TTFT
p50 / p90, throughput; the server's prefix cache is emptied before each arm, then the prompt before
the changes is sent once, unmeasured (the loop's steady state, as the replay's warm request). Then
the gateway's own overhead with a warm cache (the same prompt, alternately straight and through the
gateway), and the issue's Done-when check (10 requests in turn, the destination changing every
time). Everything is written between the `bench:gateway` markers of docs/gateway.md.

    .venv/bin/python bench/bench_gateway.py --upstream http://127.0.0.1:8100/v1 --replicas 2 \
        --requests 24 --rates 0.1,0.25,0.5 --tokens 1200

With `--replicas 2`: the arms straight, one gateway (its memory) and two gateway processes sharing
one Redis state (`--state`, the Redis at `--redis`), the requests alternating between the two; per
arm also the prefill tokens the upstream computed (vLLM's prompt tokens less its prefix-cache hits).
Written between the `bench:gateway-replicas` markers (the overhead and Done-when are not run).

With `--upstreams 2` it starts two vLLM replicas itself and compares routing across them
(`bench/gateway_upstreams.py`, the `bench:gateway-upstreams` markers).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import openai  # noqa: E402

from bench.bench_serving import CITIES, shipment_log  # noqa: E402
from bench.blocks import write_block  # noqa: E402
from serving import connect  # noqa: E402
from serving.replay import percentile  # noqa: E402
from serving.streams import arrivals  # noqa: E402

QUESTION = "What is the destination of this shipment?"
STATUSES = ("loading", "in transit", "held at customs", "delayed", "at the port", "released", "delivered")
PAPER = "98.5% against 1.0% hit rate, p90 TTFT 85.8 ms against 22.5 s (262×), throughput up to 14.5×"


SECRET = secrets.token_urlsafe(36)


def start_gateway(upstream: str, data: Path, *options: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    data.mkdir(parents=True, exist_ok=True)
    env = {
        "KVNOTES_SECRET_KEY": SECRET,  # one for every gateway of the run: replicas on one Redis share it
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KVNOTES_DATA": str(data),
        "DATABASE_URL": f"sqlite:///{data}/kvnotes.db",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "commands.cli",
            "gateway",
            "--upstream",
            upstream,
            "--port",
            str(port),
            "--policy",
            "erratum",
            "--check-rate",
            "0",
            "--timeout",
            "600",
            *options,
        ],
        env=env,
        cwd=REPO,
        stdout=(data / "gateway.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(f"{url}/metrics", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the gateway did not start: {(data / 'gateway.log').read_text()}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(client: openai.OpenAI, model: str, system: str, max_tokens: int) -> dict:
    """One streamed request: TTFT, end, header, usage, whether the stream ended with [DONE]."""
    sent = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
    )
    first, text, usage = None, "", None
    for chunk in raw.parse():
        if chunk.choices and first is None:
            first = time.perf_counter()
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    done = time.perf_counter()
    cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage and usage.prompt_tokens_details else 0
    return {
        "ttft_ms": ((first or done) - sent) * 1000,
        "latency_ms": (done - sent) * 1000,
        "text": text,
        "header": raw.headers.get("x-kvnotes-gateway", ""),
        "prompt": usage.prompt_tokens if usage else 0,
        "cached": cached,
    }


def run_arm(client, backend, model: str, warm: str, prompts: list[str], times: list[float],
            max_tokens: int) -> dict:
    """The prefix cache emptied, the warm request (unmeasured, as the replay's), then prompt i sent
    at times[i] (seconds after the first), each on its own thread. `client` may be a list (replicas):
    request i goes to client i mod its length (the warm request to the first)."""
    clients = client if isinstance(client, list) else [client]
    backend.reset_cache()
    one(clients[0], model, warm, max_tokens)  # the loop's steady state: the prompt before the changes
    before = backend.counters()
    results: list[dict | None] = [None] * len(prompts)
    start = time.perf_counter()

    def send(i: int) -> None:
        time.sleep(max(0.0, times[i] - (time.perf_counter() - start)))
        results[i] = one(clients[i % len(clients)], model, prompts[i], max_tokens)

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        list(pool.map(send, range(len(prompts))))
    elapsed = time.perf_counter() - start
    after = backend.counters()
    ttfts = [r["ttft_ms"] for r in results]
    return {
        "requests": len(prompts),
        "hit_rate": (after.hits - before.hits) / max(1.0, after.queries - before.queries),
        "prefill": (after.queries - before.queries) - (after.hits - before.hits),
        "p50": percentile(ttfts, 50),
        "p90": percentile(ttfts, 90),
        "rps": len(prompts) / elapsed,
        "headers": [r["header"] for r in results],
    }


def overhead(straight, gated, model: str, system: str, rounds: int) -> dict:
    """The same prompt (warm: a full prefix hit) alternately straight and through the gateway."""
    one(straight, model, system, 1)
    one(gated, model, system, 1)
    a, b = [], []
    for _ in range(rounds):
        a.append(one(straight, model, system, 1)["latency_ms"])
        b.append(one(gated, model, system, 1)["latency_ms"])
    return {
        "straight_ms": statistics.median(a),
        "gateway_ms": statistics.median(b),
        "added_ms": statistics.median(y - x for x, y in zip(a, b)),
        "rounds": rounds,
    }


def done_when(straight, gated, backend, model: str, record: str, url: str) -> dict:
    """10 requests in turn, the destination changing every time: vLLM's hit rate over the last 9; and
    how a raw stream through the gateway ends."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 4,
        "messages": [{"role": "system", "content": record}, {"role": "user", "content": QUESTION}],
    }
    raw = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900).text.rstrip()
    out: dict = {"last_line": raw.splitlines()[-1] if raw else ""}
    for name, client in (("straight", straight), ("gateway", gated)):
        backend.reset_cache()
        rows = [one(client, model, record.replace("Oslo", CITIES[0]), 8)]
        before = backend.counters()
        rows += [one(client, model, record.replace("Oslo", CITIES[i]), 8) for i in range(1, 10)]
        after = backend.counters()
        out[name] = {
            "hit_rate": (after.hits - before.hits) / max(1.0, after.queries - before.queries),
            "median_ttft_ms": statistics.median(r["ttft_ms"] for r in rows),
            "headers": [r["header"] for r in rows],
            "answers": [r["text"] for r in rows],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:8100/v1")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2700)
    parser.add_argument("--requests", type=int, default=48, help="per arm and rate")
    parser.add_argument("--rates", default="0.05,0.1,0.2", help="Poisson rates, requests per second")
    parser.add_argument("--overhead-rounds", type=int, default=10)
    parser.add_argument("--skip-arms", action="store_true", help="only the overhead and the Done-when check")
    parser.add_argument("--out", default=str(REPO / "docs" / "gateway.md"))
    parser.add_argument("--replicas", type=int, default=1, help="2: also two gateways on one Redis state")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="the replicas' shared state")
    parser.add_argument("--upstreams", type=int, default=1,
                        help="2: start two vLLM replicas and compare routing across them "
                             "(bench/gateway_upstreams.py)")
    parser.add_argument("--tenants", type=int, default=8, help="with --upstreams: the tenants")
    parser.add_argument("--changes", type=int, default=2,
                        help="with --upstreams: changed requests per tenant")
    args = parser.parse_args()
    if args.upstreams > 1:
        from bench.gateway_upstreams import run

        run(args)
        return
    backend = connect(args.upstream, args.model, timeout_s=900)
    record = shipment_log(backend, args.tokens)
    tokens = len(backend.prompt_tokens(record))
    assert "status: in transit" in record and "destination: Oslo" in record
    if args.replicas > 1:
        replicas(args, backend, record, tokens)
        return
    with tempfile.TemporaryDirectory() as data:
        proc, url = start_gateway(args.upstream, Path(data))
        try:
            straight = openai.OpenAI(base_url=args.upstream, api_key="none", max_retries=0, timeout=900)
            # a key of its own: a placeholder key ("none") has no tenant, and is never rewritten
            gated = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-bench-agent", max_retries=0, timeout=900)
            arms = []
            rates = [float(r) for r in args.rates.split(",") if r] + [0.0]
            for rate in [] if args.skip_arms else rates:
                times = arrivals(args.requests, rate, seed=1) if rate else [0.0] * args.requests
                prompts = _prompts(record, args.requests)
                for name, client in (("straight", straight), ("gateway", gated)):
                    result = run_arm(client, backend, args.model, record, prompts, times, 16)
                    arms.append((rate, name, result))
                    print(rate, name, {k: v for k, v in arms[-1][2].items() if k != "headers"}, flush=True)
            cost = overhead(straight, gated, args.model, record, args.overhead_rounds)
            print("overhead", cost, flush=True)
            check = done_when(straight, gated, backend, args.model, record, url)
            print("done-when", check, flush=True)
            metrics = httpx.get(f"{url}/metrics").text
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    write_block(Path(args.out), "gateway", report(args, tokens, arms, cost, check, metrics))


def _prompts(record: str, n: int) -> list[str]:
    return [record.replace("status: in transit", f"status: {STATUSES[i % len(STATUSES)]} (check {i})")
            for i in range(n)]


def replicas(args, backend, record: str, tokens: int) -> None:
    """Straight, one gateway, and `--replicas` gateways on one Redis state, alternating (see the
    module docstring)."""
    import uuid

    load = [os.getloadavg()[0]]
    state = f"{args.redis}#kvnotes-bench:{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory() as data:
        procs = [start_gateway(args.upstream, Path(data) / "one")]
        procs += [start_gateway(args.upstream, Path(data) / f"r{i}", "--state", state)
                  for i in range(args.replicas)]
        try:
            def client(url: str) -> openai.OpenAI:
                return openai.OpenAI(base_url=url, api_key="sk-bench-agent", max_retries=0, timeout=900)

            arms_clients = [("straight", client(args.upstream)), ("gateway", client(f"{procs[0][1]}/v1")),
                            (f"{args.replicas} gateways, one Redis",
                             [client(f"{u}/v1") for _, u in procs[1:]])]
            arms = []
            rates = [float(r) for r in args.rates.split(",") if r] + [0.0]
            for rate in rates:
                times = arrivals(args.requests, rate, seed=1) if rate else [0.0] * args.requests
                prompts = _prompts(record, args.requests)
                for name, arm_client in arms_clients:
                    result = run_arm(arm_client, backend, args.model, record, prompts, times, 16)
                    arms.append((rate, name, result))
                    load.append(os.getloadavg()[0])
                    print(rate, name, {k: v for k, v in result.items() if k != "headers"}, flush=True)
        finally:
            for proc, _ in procs:
                proc.terminate()
                proc.wait(timeout=30)
    write_block(Path(args.out), "gateway-replicas", replicas_report(args, tokens, arms, load))


def replicas_report(args, tokens: int, arms: list, load: list[float]) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC on {platform.machine()} ({os.cpu_count()} "
             f"cores shared with other work, load average {min(load):.1f}–{max(load):.1f} during the run), "
             f"vLLM CPU build, {args.model}, a {tokens}-token system message whose status line changes every "
             f"request, {args.requests} requests per arm, 16 tokens answered.", "",
             "| arrivals | arm | requests | vLLM hit rate | prefill tokens | TTFT p50 | TTFT p90 | req/s |",
             "|---|---|---|---|---|---|---|---|"]
    for rate, name, r in arms:
        where = f"Poisson {rate:g}/s" if rate else "saturation (all at once)"
        lines.append(f"| {where} | {name} | {r['requests']} | {r['hit_rate']:.1%} | {r['prefill']:.0f} | "
                     f"{r['p50'] / 1000:.2f} s | {r['p90'] / 1000:.2f} s | {r['rps']:.3f} |")
    return "\n".join(lines)


def report(args, tokens: int, arms: list, cost: dict, check: dict, metrics: str) -> str:
    rewrites = next(
        (
            line.split()[-1]
            for line in metrics.splitlines()
            if line.startswith("kvnotes_gateway_rewrites_total ")
        ),
        "0",
    )
    s, g = check["straight"], check["gateway"]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} ({os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}), vLLM CPU build, smollm2-135m, a {tokens}-token system message.",
        "",
    ]
    if arms:
        lines += [
            "| arrivals | arm | requests | vLLM hit rate | TTFT p50 | TTFT p90 | req/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for rate, name, r in arms:
            where = f"Poisson {rate:g}/s" if rate else "saturation (all at once)"
            lines.append(
                f"| {where} | {name} | {r['requests']} | {r['hit_rate']:.1%} | {r['p50'] / 1000:.2f} s | "
                f"{r['p90'] / 1000:.2f} s | {r['rps']:.3f} |"
            )
        lines += [
            "",
            f"The paper (96 requests per arm, Poisson 2–16 req/s, an 8B model on a GPU): {PAPER}.",
            "",
        ]
    else:
        lines += ["The Poisson arms were not run in this measurement (`--skip-arms`).", ""]
    lines += [
        f"Gateway overhead with a warm cache (the same prompt, {cost['rounds']} rounds alternately): "
        f"median {cost['straight_ms']:.0f} ms straight, {cost['gateway_ms']:.0f} ms through the gateway, "
        f"{cost['added_ms']:.0f} ms added per request (median of the paired differences).",
        "",
        "Done-when (10 requests in turn, the destination changing every time; vLLM's counters over the "
        "last 9):",
        "",
        f"- hit rate: {g['hit_rate']:.1%} through the gateway (≥ 80%: {_met(g['hit_rate'] >= 0.8)}), "
        f"{s['hit_rate']:.1%} straight (≤ 20%: {_met(s['hit_rate'] <= 0.2)});",
        f"- median TTFT: {g['median_ttft_ms'] / 1000:.2f} s through the gateway against "
        f"{s['median_ttft_ms'] / 1000:.2f} s straight (at most half: "
        f"{_met(g['median_ttft_ms'] <= s['median_ttft_ms'] / 2)});",
        f"- headers: {', '.join(dict.fromkeys(g['headers']))};",
        f"- a raw stream through the gateway ended with `{check['last_line']}`;",
        f"- the gateway's /metrics counted {rewrites} rewrites in all;",
        f"- answers through the gateway: {'; '.join(repr(a) for a in g['answers'][1:4])} …",
    ]
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    main()
