"""What sealing the gateway's texts in Redis costs per plan (issue 48 item 4).

One tenant's requests planned by the gateway's rewriter on a real Redis state, the prompt's status
line changing every request (so every plan after the first reads its base and rewrites it), with
texts sealed (AES-GCM, `serving.gateway.sealing`) and in the clear, alternately; at each prompt size
the median time per plan of each, and the codec alone (seal + open of the base's texts). Writes the
block `gateway-sealing` of docs/gateway.md.

    python bench/bench_gateway_sealing.py [--redis redis://127.0.0.1:6379/0] [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from bench.blocks import write_block  # noqa: E402
from serving.gateway import CHAT, Rewriter, Settings, read_prompt  # noqa: E402
from serving.gateway.redis_state import RedisState  # noqa: E402
from serving.gateway.sealing import GatewaySecret  # noqa: E402
from serving.gateway.stats import Stats  # noqa: E402

SIZES = (12_500, 250_000, 1_000_000)  # characters of the system prompt
STATUSES = ("active", "held", "cleared", "suspended", "open", "closed")


def body(chars: int, status: str) -> dict:
    line = "2026-03-01 08:00 The carrier confirmed a step of the booking and logged it.\n"
    log = line * (chars // len(line) + 1)
    system = f"You are the shipping agent.\nrecord_id: SR-20417\nstatus: {status}\n\n" + log[:chars]
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": "What is the status?"}]}


def plan_times(url: str, sealed: bool, chars: int, rounds: int, secret: GatewaySecret) -> list[float]:
    prefix = f"kvnotes-bench:{uuid.uuid4().hex[:8]}:"
    settings = Settings(check_rate=0)
    state = RedisState(url, settings.limits, prefix, secret.sealer if sealed else None)
    stats = Stats(state)
    rewriter = Rewriter(settings, stats=stats)
    times = []
    try:
        for i in range(rounds + 1):
            prompt, why = read_prompt(CHAT, body(chars, STATUSES[i % len(STATUSES)]))
            start = time.perf_counter()
            plan = rewriter.plan("tenant-a", prompt, why)
            elapsed = time.perf_counter() - start
            if i:  # the first makes the base
                assert plan.context is not None, plan.reason
                times.append(elapsed)
    finally:
        stats.close()
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
        state.close()
    return times


def codec_ms(chars: int, secret: GatewaySecret, rounds: int) -> float:
    text = body(chars, "active")["messages"][0]["content"]
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        secret.sealer.open(secret.sealer.seal(text, "k"), "k")
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", default=str(REPO / "docs" / "gateway.md"))
    args = parser.parse_args()
    secret = GatewaySecret(os.urandom(32).hex())
    load = [os.getloadavg()[0]]
    rows = []
    for chars in SIZES:
        clear, sealed = [], []
        for _ in range(2):  # alternately, so the machine's load falls on both alike
            clear += plan_times(args.redis, False, chars, args.rounds // 2, secret)
            sealed += plan_times(args.redis, True, chars, args.rounds // 2, secret)
        load.append(os.getloadavg()[0])
        c, s = statistics.median(clear) * 1000, statistics.median(sealed) * 1000
        rows.append(f"| {chars:,} | {len(clear)} | {c:.2f} ms | {s:.2f} ms | {s - c:+.2f} ms | "
                    f"{codec_ms(chars, secret, 20):.2f} ms |")
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        f"Measured {when} on {platform.machine()} ({os.cpu_count()} cores shared with other work, load "
        f"average {min(load):.1f}–{max(load):.1f}), Redis on the same machine; one tenant's requests, "
        "its status line changed every time, each plan reading and rewriting its base.",
        "",
        "| prompt characters | plans per arm | plan, texts in the clear (median) | plan, sealed (median) "
        "| sealing adds | seal + open of the texts alone |",
        "|---|---|---|---|---|---|",
        *rows])
    print(text)
    write_block(Path(args.out), "gateway-sealing", text)


if __name__ == "__main__":
    main()
