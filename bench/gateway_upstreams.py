"""`bench/bench_gateway.py --upstreams 2`: the gateway in front of two vLLM replicas (issue 50).

    KVNOTES_VLLM_VENV=/root/.cache/kvnotes/venv-vllm .venv/bin/python bench/bench_gateway.py \\
        --upstreams 2 --tenants 8 --changes 2 --tokens 600 --rates 0.5

Starts two vLLM CPU servers of the bundled model (`scripts/vllm.sh`, each publishing its KV events
over ZMQ), and stops them after. 8 tenants (an API key each) have an agent prompt of about `--tokens`
tokens (a shipment record of their own) whose status line changes. Per arm, both prefix caches are
emptied, each tenant's base is sent once (all at once, unmeasured: the loop's steady state), then its
`--changes` changed requests at each Poisson rate and at saturation (all at once), measured:

- straight, round-robin: the client alternates between the two replicas itself;
- gateway, round-robin (`--route round-robin`);
- gateway by base (`--route base`, the default);
- gateway by KV events (`--kv-events` of both replicas);
- gateway, one replica: the reference hit rate.

Per arm: the hit rate from the replicas' own `/metrics` (vLLM's prefix-cache counters summed over
both), the prefill tokens they computed (queries less hits), TTFT p50 / p90, throughput. Then, for
the two base-routing arms, one replica's cache is emptied (`/reset_prefix_cache`: vLLM says
AllBlocksCleared, as after a restart) and each tenant sends one more request: where they went and
why. Written between the `bench:gateway-upstreams` markers of docs/gateway.md, with the load average.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from bench.blocks import write_block
from serving import connect
from serving.replay import percentile
from serving.streams import arrivals

REPO = Path(__file__).resolve().parents[1]
STATUSES = ("loading", "in transit", "held at customs", "delayed", "at the port", "released", "delivered")
AGENTS = ("billing", "customs", "dispatch", "warehouse", "claims", "tracking", "booking", "returns")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(log: Path, model: str) -> tuple[subprocess.Popen, str, str]:
    """A vLLM server on a free port publishing KV events on another: (process, URL, events URL)."""
    port, events = _free_port(), _free_port()
    # a wildcard address: vLLM binds it (a host's address would make vLLM connect to it instead)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}"}
    proc = subprocess.Popen([str(REPO / "scripts" / "vllm.sh"), "--model", model, "--port", str(port),
                             "--kv-events-config", json.dumps(config)],
                            cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{events}"


def wait_served(url: str, proc: subprocess.Popen, log: Path, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM at {url} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"vLLM at {url} did not start within {seconds:g} s")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def tenant_prompt(record: str, tenant: int, change: int) -> str:
    """Tenant `tenant`'s agent prompt, its status at change `change` (0: the base)."""
    agent = AGENTS[tenant % len(AGENTS)]
    head = f"You are the {agent} agent of desk {tenant + 1}, account AC-{7310 + tenant}.\n"
    status = "in transit" if change == 0 else f"{STATUSES[change % len(STATUSES)]} (update {change})"
    return head + record.replace("status: in transit", f"status: {status}")


def one(client: openai.OpenAI, model: str, system: str, max_tokens: int) -> dict:
    from bench.bench_gateway import one as timed

    return timed(client, model, system, max_tokens)


def counters(backends) -> tuple[float, float]:
    found = [b.counters() for b in backends]
    return sum(c.queries for c in found if c), sum(c.hits for c in found if c)


def routes(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "kvnotes_gateway_routes_total":
                out[s.labels["why"]] = s.value
            elif s.name.startswith("kvnotes_gateway_kv_events_") and s.name.endswith("_total"):
                key = s.name.removeprefix("kvnotes_gateway_kv_events_").removesuffix("_total")
                out[f"events:{key}"] = out.get(f"events:{key}", 0.0) + s.value
    return out


def run(args) -> None:
    from bench.bench_gateway import start_gateway
    from bench.bench_serving import shipment_log

    load = [os.getloadavg()[0]]
    logs = Path(tempfile.mkdtemp(prefix="bench-upstreams-"))
    started = [start_vllm(logs / f"vllm{i}.log", args.model) for i in range(2)]
    try:
        for i, (proc, url, _) in enumerate(started):
            wait_served(url, proc, logs / f"vllm{i}.log")
        urls = [f"{url}/v1" for _, url, _ in started]
        events = [e for _, _, e in started]
        backends = [connect(u, args.model, timeout_s=900) for u in urls]
        record = shipment_log(backends[0], args.tokens)
        tokens = len(backends[0].prompt_tokens(tenant_prompt(record, 0, 0)))
        arms = [("straight, round-robin", None), ("gateway, round-robin", ("--route", "round-robin")),
                ("gateway by base", ()), ("gateway by KV events", ("--kv-events", events[0], "--kv-events",
                                                                  events[1])),
                ("gateway by base, one replica", ("one",))]
        rates = [float(r) for r in args.rates.split(",") if r] + [0.0]
        results, after_reset = [], []
        for rate in rates:
            for name, options in arms:
                last = rate == rates[-1] and name in ("gateway by base", "gateway by KV events")
                result, reset = arm(args, backends, urls, record, name, options, rate, logs, reset=last,
                                    start_gateway=start_gateway)
                results.append((rate, name, result))
                if reset:
                    after_reset.append((name, reset))
                load.append(os.getloadavg()[0])
                print(rate, name, {k: v for k, v in result.items() if k != "routes"}, flush=True)
    finally:
        for proc, _, _ in started:
            stop(proc)
    write_block(Path(args.out), "gateway-upstreams", report(args, tokens, results, after_reset, load))


def arm(args, backends, urls, record, name, options, rate, logs, reset, start_gateway):
    """One arm at one rate (see the module docstring); (result, what the reset showed or None)."""
    for backend in backends:
        backend.reset_cache()
    proc = None
    if options is None:
        clients = [openai.OpenAI(base_url=u, api_key="none", max_retries=0, timeout=900) for u in urls]
        client_of = lambda tenant, i: clients[i % 2]  # noqa: E731
    else:
        upstream_options = () if options == ("one",) else ("--upstream", urls[1], *options)
        proc, url = start_gateway(urls[0], logs / name.replace(" ", "-").replace(",", ""), *upstream_options)
        gated = [openai.OpenAI(base_url=f"{url}/v1", api_key=f"sk-bench-tenant-{t}", max_retries=0,
                               timeout=900) for t in range(args.tenants)]
        client_of = lambda tenant, i: gated[tenant]  # noqa: E731
    used = backends[:1] if options == ("one",) else backends
    try:
        with ThreadPoolExecutor(max_workers=args.tenants) as pool:  # the bases, all at once, unmeasured
            list(pool.map(lambda t: one(client_of(t, t), args.model, tenant_prompt(record, t, 0), 8),
                          range(args.tenants)))
        work = [(t, c) for c in range(1, args.changes + 1) for t in range(args.tenants)]
        times = arrivals(len(work), rate, seed=1) if rate else [0.0] * len(work)
        before = counters(used)
        out: list[dict | None] = [None] * len(work)
        start = time.perf_counter()

        def send(i: int) -> None:
            time.sleep(max(0.0, times[i] - (time.perf_counter() - start)))
            tenant, change = work[i]
            out[i] = one(client_of(tenant, i), args.model, tenant_prompt(record, tenant, change), 16)

        with ThreadPoolExecutor(max_workers=len(work)) as pool:
            list(pool.map(send, range(len(work))))
        elapsed = time.perf_counter() - start
        after = counters(used)
        ttfts = [r["ttft_ms"] for r in out]
        result = {"requests": len(work), "hit_rate": (after[1] - before[1]) / max(1.0, after[0] - before[0]),
                  "prefill": (after[0] - before[0]) - (after[1] - before[1]),
                  "p50": percentile(ttfts, 50), "p90": percentile(ttfts, 90), "rps": len(work) / elapsed,
                  "routes": routes(url) if proc is not None else {}}
        seen = None
        if reset:
            backends[0].reset_cache()  # replica 0 forgets everything (AllBlocksCleared), as after a restart
            time.sleep(1.0)
            before = counters(backends)
            for t in range(args.tenants):
                one(client_of(t, 0), args.model, tenant_prompt(record, t, args.changes + 1), 8)
            after = counters(backends)
            seen = {"hit_rate": (after[1] - before[1]) / max(1.0, after[0] - before[0]),
                    "routes": {k: v - result["routes"].get(k, 0.0) for k, v in routes(url).items()}}
        return result, seen
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


def report(args, tokens: int, results: list, after_reset: list, load: list[float]) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC on {platform.machine()} ({os.cpu_count()} "
             f"cores shared with other work, load average {min(load):.1f}–{max(load):.1f} during the run), "
             f"two vLLM CPU replicas of {args.model}, {args.tenants} tenants, a {tokens}-token agent prompt "
             f"each whose status line changes, {args.changes} changed requests per tenant per arm after its "
             f"base (the bases unmeasured), 16 tokens answered.", "",
             "| arrivals | arm | requests | hit rate (replicas' /metrics) | prefill tokens | TTFT p50 "
             "| TTFT p90 | req/s | routes (why) |", "|---|---|---|---|---|---|---|---|---|"]
    for rate, name, r in results:
        where = f"Poisson {rate:g}/s" if rate else "saturation (all at once)"
        why = ", ".join(f"{k} {v:g}" for k, v in sorted(r["routes"].items()) if not k.startswith("events:"))
        lines.append(f"| {where} | {name} | {r['requests']} | {r['hit_rate']:.1%} | {r['prefill']:.0f} | "
                     f"{r['p50'] / 1000:.2f} s | {r['p90'] / 1000:.2f} s | {r['rps']:.3f} | {why or '–'} |")
    events = [r["routes"] for _, name, r in results if name == "gateway by KV events"]
    if events:
        last = events[-1]
        n = {k: last.get(f"events:{k}", 0.0) for k in ("batches", "blocks_stored", "blocks_removed",
                                                      "cleared", "seconds")}
        lines += ["", f"KV events read by the events arm's gateway at saturation: {n['batches']:.0f} "
                  f"batches, {n['blocks_stored']:.0f} blocks stored, {n['blocks_removed']:.0f} removed, "
                  f"{n['cleared']:.0f} clears, {n['seconds'] * 1000:.1f} ms of its CPU in all.", ""]
    for name, seen in after_reset:
        why = ", ".join(f"{k} {v:g}" for k, v in sorted(seen["routes"].items()) if not k.startswith("events:")
                        and v)
        lines.append(f"- {name}, after replica 0's cache was emptied: hit rate {seen['hit_rate']:.1%} over "
                     f"the {args.tenants} next requests; routed: {why or '–'}.")
    return "\n".join(lines)
