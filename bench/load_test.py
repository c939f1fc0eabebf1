"""A crowd of signed-in users against a real `kvnotes serve`, on SQLite and on PostgreSQL.

    .venv/bin/python bench/load_test.py [--notebooks 10000] [--users 50] [--seconds 30] [--burst 200]
        [--think 0] [--databases sqlite,postgresql] [--out docs/load-latest.md]

For each database: a fresh one seeded with `--notebooks` notebooks, 2,000 finished runs and 200
skills (`bench/load_pages.seed`); a user and an API token (`kvnotes users add`, `kvnotes tokens
create`); `kvnotes serve --no-worker` with sign-in required (`KVNOTES_AUTH=required`) on a free
loopback port; then two phases, every request carrying the token:

1. `--users` users for `--seconds`, each GETting a random read page after the other (with `--think S`,
   thinking 0.5-1.5 x S seconds between pages; none by default)
   (the notebooks list and its later pages, a notebook, the runs list, a run, the skills library, the
   JSON notebook and list);
2. `--burst` requests released at once (`GET /api/notebooks?limit=50`).

It prints, and writes to `--out`, per phase: requests, errors (anything but 200, or no answer), 5xx,
503s, and p50 / p95 / p99 latency, with the machine and its 1-minute load average before and after.
PostgreSQL is the server at `KVNOTES_TEST_PG` (default postgres@127.0.0.1:5432); a scratch database
is created and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.load_pages import _free_port, pages, percentile, seed, wait_until_answering  # noqa: E402

PG_ADMIN_URL = os.environ.get("KVNOTES_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SECRET = "load-test-" + uuid.uuid4().hex + uuid.uuid4().hex


@dataclass
class Phase:
    """What one phase saw: latencies (ms) and answers by status (0: no answer)."""

    name: str
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # why a request got no answer

    def record(self, status: int, ms: float) -> None:
        self.latencies.append(ms)
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def row(self, database: str, seconds: float | None) -> str:
        total = len(self.latencies)
        errors = total - self.statuses.get(200, 0)
        server_errors = sum(n for status, n in self.statuses.items() if status >= 500)
        rate = f"{total / seconds:.0f}/s" if seconds else "at once"
        p = [percentile(self.latencies, q) for q in (50, 95, 99)]
        return (f"| {database} | {self.name} | {total:,} ({rate}) | {errors} | {server_errors} | "
                f"{self.statuses.get(503, 0)} | {p[0]:.0f} | {p[1]:.0f} | {p[2]:.0f} |")


@contextmanager
def database(kind: str, data: Path) -> Iterator[str | None]:
    """None for SQLite under `data`; a scratch PostgreSQL database's URL, dropped afterwards."""
    if kind == "sqlite":
        yield None
        return
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"kvnotes_load_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _cli(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "commands.cli", *args], env=env, cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"kvnotes {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


@contextmanager
def served(env: dict[str, str], data: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`kvnotes serve --no-worker`, sign-in required; yields its URL and a signed-in token's headers."""
    _cli(env, "users", "add", "load", "--password-stdin", stdin="a long password for the load test\n")
    headers = {"Authorization": f"Bearer {_cli(env, 'tokens', 'create', 'load')}"}
    port = _free_port()
    log = (data / "serve.log").open("w")
    command = [sys.executable, "-m", "commands.cli", "serve", "--no-worker", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(url + "/api/health", tries=300)
        yield url, headers
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def _get(client: httpx.AsyncClient, path: str, phase: Phase) -> None:
    t0 = time.perf_counter()
    try:
        status = (await client.get(path)).status_code
    except httpx.HTTPError as exc:
        status = 0
        why = f"{type(exc).__name__}: {str(exc)[:80]}"
        phase.failures[why] = phase.failures.get(why, 0) + 1
    phase.record(status, (time.perf_counter() - t0) * 1000)


async def crowd(url: str, headers: dict[str, str], users: int, seconds: float, routes: dict,
                think: float = 0.0) -> Phase:
    """`users` users for `seconds`, each thinking 0.5-1.5 x `think` s between its requests (none at 0)."""
    phase = Phase(f"{users} users, " + (f"{think:g} s think time" if think else "no think time"))
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:
        until = time.monotonic() + seconds

        async def user() -> None:
            while time.monotonic() < until:
                await _get(client, random.choice(list(routes.values()))(), phase)
                if think:
                    await asyncio.sleep(think * random.uniform(0.5, 1.5))

        await asyncio.gather(*(user() for _ in range(users)))
    return phase


async def burst(url: str, headers: dict[str, str], n: int) -> Phase:
    """`n` requests sent at once, each on its own connection."""
    phase = Phase(f"{n} simultaneous")
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=120) as client:
        await asyncio.gather(*(_get(client, "/api/notebooks?limit=50", phase) for _ in range(n)))
    return phase


def _forget_the_previous_database() -> None:
    from data.db import reset_engines
    from data.settings import get_settings

    for name in ("DATABASE_URL", "KVNOTES_DATA", "BROKER_URL", "RESULT_BACKEND"):
        os.environ.pop(name, None)
    get_settings.cache_clear()
    reset_engines()


def run_one(kind: str, args: argparse.Namespace) -> tuple[list[str], tuple[float, float]]:
    data = Path(tempfile.mkdtemp(prefix=f"kvnotes-load-{kind}-"))
    with database(kind, data) as url:
        t0 = time.perf_counter()
        _forget_the_previous_database()
        counts = seed(data, args.notebooks, url)
        print(f"[{kind}] seeded {counts} in {time.perf_counter() - t0:.1f} s", flush=True)
        env = {**os.environ, "KVNOTES_AUTH": "required", "KVNOTES_SECRET_KEY": SECRET,
               "PYTHONPATH": str(REPO)}
        with served(env, data) as (base, headers):
            before = os.getloadavg()[0]
            routes = pages(counts["notebooks"], counts["runs"])
            phases = [asyncio.run(crowd(base, headers, args.users, args.seconds, routes, args.think)),
                      asyncio.run(burst(base, headers, args.burst))]
            after = os.getloadavg()[0]
    rows = [phases[0].row(kind, args.seconds), phases[1].row(kind, None)]
    print("\n".join(rows), flush=True)
    for phase in phases:
        print(f"[{kind}] {phase.name}: answers by status {dict(sorted(phase.statuses.items()))}; "
              f"no answer: {phase.failures or 'none'}", flush=True)
    return rows, (before, after)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notebooks", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--think", type=float, default=0.0,
                        help="mean think time between a user's requests, s (0.5-1.5 x it; 0: none)")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--out", type=Path, default=None, help="write the table (markdown) here too")
    args = parser.parse_args()
    rows, loads = [], []
    for kind in [k.strip() for k in args.databases.split(",") if k.strip()]:
        got, load = run_one(kind, args)
        rows += got
        loads.append(f"{kind} {load[0]:.1f} → {load[1]:.1f}")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {args.notebooks:,} notebooks; signed in with an API "
             f"token; `kvnotes serve` and the load generator on one machine ({machine}); 1-minute load "
             f"average before → after: {'; '.join(loads)}", "",
             "| database | phase | requests | errors | 5xx | of which 503 | p50 ms | p95 ms | p99 ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
