"""The home page with 10,000 notebooks, for one user: p50 / p95 / max latency of `/` (its first
page) and of later pages, against the real server. Issue 9's target: p95 ≤ 100 ms for one user.

    .venv/bin/python bench/bench_home_page.py [--notebooks 10000] [--requests 300]

It seeds a fresh data folder with `bench/load_pages.py`'s `seed` (each notebook a ~1 KB document,
a field, its erratum and a question; 2,000 finished runs spread over them, so cards show last-run
outcomes), serves the app with uvicorn (one process, the embedded SQLite default, no worker), then
GETs each page `--requests` times one after another (after 20 warm-up requests) and prints a
table. Client and server share this machine; its cores and load average are printed with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from load_pages import seed, served_app  # noqa: E402


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure(client: httpx.Client, path, requests: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(20):
        client.get(path())
    for _ in range(requests):
        t0 = time.perf_counter()
        r = client.get(path())
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.status_code
        size = len(r.content)
    return times, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notebooks", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvnotes-home-"))
    t0 = time.perf_counter()
    counts = seed(data, args.notebooks)
    print(f"seeded {counts} in {time.perf_counter() - t0:.1f} s under {data}")
    pages = -(-counts["notebooks"] // 24)
    rows = []
    with served_app() as base:
        load = os.getloadavg()[0]
        with httpx.Client(base_url=base, timeout=30) as client:
            for name, path in (("/", lambda: "/"),
                               ("/?page=N (random)", lambda: f"/?page={random.randint(2, pages)}"),
                               (f"/?page={pages} (last)", lambda: f"/?page={pages}")):
                times, size = measure(client, path, args.requests)
                rows.append(f"| `{name}` | {args.requests} | {percentile(times, 50):.1f} | "
                            f"{percentile(times, 95):.1f} | {max(times):.1f} | {size / 1024:.0f} KB |")
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}")
    print(f"one user, requests one after another; {counts['notebooks']:,} notebooks ({pages} pages of 24), "
          f"{counts['runs']:,} runs; uvicorn and client on one machine ({machine}; "
          f"1-minute load average {load:.1f}), "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print("| page | requests | p50 ms | p95 ms | max ms | size |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
