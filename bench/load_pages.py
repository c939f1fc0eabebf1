"""Load on the read pages: 50 simulated users against the real server with 10,000 notebooks.

    .venv/bin/python bench/load_pages.py [--users 50] [--notebooks 10000] [--seconds 60] [--out docs/load.md]

What it does, all on this machine (loopback only, bounded in time):
1. a fresh data folder with `--notebooks` notebooks (a ~1 KB document, two fields and their errata,
   a question each), 200 skills and 2,000 finished runs, written straight into SQLite;
2. `kvnotes serve`'s web app (uvicorn, one process, the embedded default: no sign-in) on a free
   port, without a worker (the read pages need none);
3. `--users` users, each looping for `--seconds`: pick a read page (the notebooks list and its later
   pages, a notebook, the runs list, a run, the skills library, the JSON notebook and list), GET it,
   think 0.5–1.5 s (a person reading), like locust's `between(0.5, 1.5)`;
4. a table of p50 / p95 / p99 latency and errors per page and in all, printed and written to `--out`,
   with the server's own time (its `Server-Timing` header: from the request's arrival to its answer's
   start), which tells the app's cost from the wait for a core on a busy machine.

The load generator (asyncio + httpx) shares the machine's cores with the server, so the figures are
an upper bound on what the server alone would show; the machine is named in the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DOCUMENT = ("Account record {i}\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n"
            "Region: north\n\n"
            "Access policy\n\nOnly accounts whose status is active may log in. " * 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_app() -> Iterator[str]:
    """uvicorn serving app.main:app with this process's environment on a free loopback port; yields
    its base URL once it answers, stops it after."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app",
                               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(base + "/api/notebooks?limit=1", tries=100)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_until_answering(url: str, tries: int) -> None:
    """Poll `url` every 0.2 s until the server answers anything (at most `tries` times)."""
    for _ in range(tries):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)


def seed(data: Path, notebooks: int, database_url: str | None = None) -> dict[str, int]:
    """Fill a fresh database (SQLite under `data`, or `database_url`) through the ORM's tables (bulk
    inserts, one transaction)."""
    os.environ.update({"KVNOTES_DATA": str(data),
                       "DATABASE_URL": database_url or f"sqlite:///{data}/kvnotes.db",
                       "BROKER_URL": f"sqla+sqlite:///{data}/broker.db",
                       "RESULT_BACKEND": f"db+sqlite:///{data}/results.db"})
    from data.db import get_engine
    from data.migrate import upgrade_to_head
    from data.models import Erratum, Field, Notebook, Question, Run, RunResult, Skill

    upgrade_to_head()
    now = datetime.now(UTC)
    rng = random.Random(7)
    with get_engine().begin() as c:
        c.execute(Notebook.__table__.insert(), [
            {"id": i, "title": f"Account {i}", "model": "smollm2-135m", "document": DOCUMENT.format(i=i),
             "created_at": now - timedelta(minutes=i), "updated_at": now - timedelta(minutes=i),
             "created_by": "local"}
            for i in range(1, notebooks + 1)])
        start = DOCUMENT.index("active")
        c.execute(Field.__table__.insert(), [
            {"notebook_id": i, "start": start, "end": start + 6, "old_value": "active",
             "new_value": "suspended", "label": "status", "created_at": now}
            for i in range(1, notebooks + 1)])
        c.execute(Erratum.__table__.insert(), [
            {"notebook_id": i, "field_id": i,
             "text": "[STATE UPDATE] status has changed from active to suspended.",
             "source": "generated", "position": 0, "created_at": now} for i in range(1, notebooks + 1)])
        c.execute(Question.__table__.insert(), [
            {"notebook_id": i, "text": "Can this account log in?", "choices": ["yes", "no"], "cot": False,
             "created_at": now} for i in range(1, notebooks + 1)])
        c.execute(Skill.__table__.insert(), [
            {"id": i, "name": f"skill {i}", "text": "Answer with one word.", "model": "smollm2-135m",
             "status": "compiled", "token_count": 7, "progress": 1.0, "created_at": now, "updated_at": now,
             "created_by": "local"} for i in range(1, 201)])
        runs = min(2000, notebooks)
        snapshot = {"model": "smollm2-135m", "document": DOCUMENT.format(i=0), "fields": [], "errata": [],
                    "placements": [],
                    "question": {"text": "Can this account log in?", "choices": ["yes", "no"], "cot": False},
                    "strategies": ["recompute", "stale"]}
        c.execute(Run.__table__.insert(), [
            {"id": r, "notebook_id": rng.randint(1, notebooks), "kind": "edit", "snapshot": snapshot,
             "strategies": ["recompute", "stale"], "status": "succeeded", "stage": "done", "progress": 1.0,
             "timings": {"engine_ms": 900.0}, "created_at": now, "finished_at": now, "created_by": "local"}
            for r in range(1, runs + 1)])
        c.execute(RunResult.__table__.insert(), [
            {"run_id": r, "strategy": s, "decision": "no", "choice_probs": {"yes": 0.2, "no": 0.8},
             "kl_to_recompute": 0.0 if s == "recompute" else 0.3, "top1_agrees": True, "topk_overlap": 10,
             "logit_cosine": 1.0, "decision_matches_recompute": True, "tokens_computed": 60,
             "latency_ms": 400.0, "text": "no", "detail": ""}
            for r in range(1, runs + 1) for s in ("recompute", "stale")])
    return {"notebooks": notebooks, "runs": runs, "skills": 200}


def pages(notebooks: int, runs: int) -> dict[str, callable]:
    """The read pages a user visits, by name, each a function giving a path."""
    return {
        "/": lambda: "/",
        "/?page=N": lambda: f"/?page={random.randint(2, 50)}",
        "/notebooks/{id}": lambda: f"/notebooks/{random.randint(1, notebooks)}",
        "/runs": lambda: "/runs",
        "/runs/{id}": lambda: f"/runs/{random.randint(1, runs)}",
        "/skills": lambda: "/skills",
        "/api/notebooks/{id}": lambda: f"/api/notebooks/{random.randint(1, notebooks)}",
        "/api/notebooks": lambda: "/api/notebooks?limit=50",
    }


async def user(client: httpx.AsyncClient, routes: dict, until: float, samples: dict, errors: dict,
               server: dict) -> None:
    names = list(routes)
    while time.monotonic() < until:
        name = random.choice(names)
        t0 = time.perf_counter()
        try:
            r = await client.get(routes[name]())
            ok = r.status_code == 200
            timing = r.headers.get("server-timing", "")
            if timing.startswith("app;dur="):
                server.setdefault(name, []).append(float(timing.removeprefix("app;dur=")))
        except httpx.HTTPError:
            ok = False
        samples.setdefault(name, []).append((time.perf_counter() - t0) * 1000)
        if not ok:
            errors[name] = errors.get(name, 0) + 1
        await asyncio.sleep(random.uniform(0.5, 1.5))


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def drive(base: str, users: int, seconds: float, routes: dict) -> tuple[dict, dict, dict]:
    samples: dict[str, list[float]] = {}
    server: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        until = time.monotonic() + seconds
        await asyncio.gather(*(user(client, routes, until, samples, errors, server) for _ in range(users)))
    return samples, errors, server


def table(samples: dict, errors: dict, server: dict) -> list[str]:
    rows = ["| page | requests | errors | p50 ms | p95 ms | p99 ms | server p50 / p95 / p99 ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    everything = [v for values in samples.values() for v in values]
    in_server = [v for values in server.values() for v in values]
    for name, values in [*sorted(samples.items()), ("all", everything)]:
        errs = sum(errors.values()) if name == "all" else errors.get(name, 0)
        own = in_server if name == "all" else server.get(name, [0.0])
        rows.append(f"| `{name}` | {len(values)} | {errs} | {percentile(values, 50):.0f} | "
                    f"{percentile(values, 95):.0f} | {percentile(values, 99):.0f} | "
                    f"{percentile(own, 50):.0f} / {percentile(own, 95):.0f} / {percentile(own, 99):.0f} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--notebooks", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None, help="write the table (markdown) here too")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvnotes-load-"))
    t0 = time.perf_counter()
    counts = seed(data, args.notebooks)
    print(f"seeded {counts} in {time.perf_counter() - t0:.1f} s under {data}")
    with served_app() as base:
        load_before = os.getloadavg()[0]
        samples, errors, server_ms = asyncio.run(
            drive(base, args.users, args.seconds, pages(counts["notebooks"], counts["runs"])))
        load_after = os.getloadavg()[0]
    total = sum(len(v) for v in samples.values())
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}")
    head = (f"{args.users} users, {args.seconds:.0f} s, think time 0.5–1.5 s, "
            f"{counts['notebooks']:,} notebooks, {counts['runs']:,} runs, {counts['skills']} skills; "
            f"{total} requests ({total / args.seconds:.1f}/s); "
            f"one uvicorn process and the load generator on one machine ({machine}; 1-minute load average "
            f"{load_before:.1f} before, {load_after:.1f} after), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    lines = [head, "", *table(samples, errors, server_ms)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(json.dumps({"errors": sum(errors.values()), "requests": total}))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
