"""What leaving WAL costs: SQLite's rollback journal (what `data.db` uses, so no process maps a
shared-memory WAL index `-shm` that storage can take away with a SIGBUS) against WAL, in processes
shaped like kvnotes': readers running a page's few queries in one read transaction, and writers
committing small transactions (a field, a run's progress), each as fast as it can, for `--seconds`.

Prints, per journal mode: reads and writes done per second (all processes), their p50 / p95 / max
latency in ms, and how many hit "database is locked" (after the 5 s busy timeout the app uses).
Counted operations, on one machine, side by side in one run; quote `uptime`'s load beside them.

    .venv/bin/python bench/sqlite_journal.py --readers 6 --writers 2 --seconds 10 [--write-rate 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import statistics
import tempfile
import time

MODES = ("wal", "delete", "truncate")
ROWS = 5000


def _connect(path: str, mode: str, first: bool = False) -> sqlite3.Connection:
    """A connection as `data.db` opens one; WAL is a property of the file (set once, by `first`),
    a rollback journal's kind is the connection's own."""
    db = sqlite3.connect(path, timeout=5, isolation_level=None)
    db.execute("PRAGMA busy_timeout=5000")
    if first or mode != "wal":
        db.execute(f"PRAGMA journal_mode={mode}")
    db.execute("PRAGMA mmap_size=0")
    return db


def _seed(path: str, mode: str) -> None:
    db = _connect(path, mode, first=True)
    db.execute("CREATE TABLE notebooks (id INTEGER PRIMARY KEY, title TEXT, document TEXT, updated_at REAL)")
    db.execute("CREATE TABLE fields (id INTEGER PRIMARY KEY, notebook_id INTEGER, value TEXT)")
    db.execute("CREATE INDEX fields_nb ON fields (notebook_id)")
    db.execute("BEGIN")
    for i in range(1, ROWS + 1):
        db.execute("INSERT INTO notebooks VALUES (?, ?, ?, ?)", (i, f"notebook {i}", "x" * 2000, time.time()))
        db.execute("INSERT INTO fields (notebook_id, value) VALUES (?, ?)", (i, "active"))
    db.execute("COMMIT")
    db.close()


def _work(path: str, mode: str, kind: str, seconds: float, seed: int, out: mp.Queue,
          write_rate: float = 0.0) -> None:
    import random

    rng = random.Random(seed)
    db = _connect(path, mode)
    times, locked = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        nb = rng.randint(1, ROWS)
        t0 = time.perf_counter()
        try:
            if kind == "read":  # a page: its notebook, its fields, a list
                db.execute("BEGIN")
                db.execute("SELECT * FROM notebooks WHERE id = ?", (nb,)).fetchall()
                db.execute("SELECT * FROM fields WHERE notebook_id = ?", (nb,)).fetchall()
                db.execute("SELECT id, title FROM notebooks ORDER BY updated_at DESC LIMIT 50").fetchall()
                db.execute("COMMIT")
            else:  # a small change: a field, its notebook touched
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO fields (notebook_id, value) VALUES (?, ?)", (nb, "suspended"))
                db.execute("UPDATE notebooks SET updated_at = ? WHERE id = ?", (time.time(), nb))
                db.execute("COMMIT")
            times.append(time.perf_counter() - t0)
            if kind == "write" and write_rate:  # a worker's progress and beat writes, not a flood
                time.sleep(1.0 / write_rate)
        except sqlite3.OperationalError:
            locked += 1
            if db.in_transaction:
                db.execute("ROLLBACK")
    out.put((kind, times, locked))


def measure(mode: str, readers: int, writers: int, seconds: float, write_rate: float) -> dict[str, tuple]:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bench.db")
        _seed(path, mode)
        out: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_work, args=(path, mode, kind, seconds, i, out, write_rate))
                 for i, kind in enumerate(["read"] * readers + ["write"] * writers)]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        shm = os.path.exists(path + "-shm")
    by_kind: dict[str, tuple] = {}
    for kind in ("read", "write"):
        times = sorted(t for k, ts, _ in results if k == kind for t in ts)
        locked = sum(n for k, _, n in results if k == kind)
        if times:
            p95 = times[int(0.95 * (len(times) - 1))]
            by_kind[kind] = (len(times) / seconds, statistics.median(times) * 1e3, p95 * 1e3, times[-1] * 1e3,
                             locked)
    by_kind["shm"] = (shm,)
    return by_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=6)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--write-rate", type=float, default=0.0,
                        help="writes a second per writer (0: as fast as it can)")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1 min); {args.readers} reader and {args.writers} writer "
          f"processes, {args.seconds:g} s a mode, writes a second per writer: "
          f"{args.write_rate or 'unthrottled'}")
    print("| journal | -shm mapped | reads/s | read p50 ms | read p95 ms | read max ms | writes/s | "
          "write p50 ms | write p95 ms | write max ms | locked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        m = measure(mode, args.readers, args.writers, args.seconds, args.write_rate)
        r, w = m["read"], m["write"]
        shm = "yes" if m["shm"][0] else "no"
        print(f"| {mode} | {shm} | {r[0]:.0f} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.0f} | "
              f"{w[0]:.0f} | {w[1]:.2f} | {w[2]:.2f} | {w[3]:.0f} | {r[4] + w[4]} |")


if __name__ == "__main__":
    main()
