"""boto3 against obstore on many small objects: what the shared KV tier (issue 40) is built on.

    eval "$(scripts/s3.sh --port 18400 --dir /tmp/s3-bench --detach)"
    .venv/bin/python bench/bench_s3_clients.py [--objects 500] [--kib 64] [--threads 16]

Each client puts, heads and gets N objects of K KiB (a KV block of a small model is 50-300 KiB)
under a fresh prefix, one after another (serial) and from a thread pool (parallel: how the store's
batch_get/batch_set run). boto3 is given a connection pool as large as the thread pool (botocore
pools 10 by default, so 16 threads would queue). Prints a table in objects per second and MiB/s.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def boto3_ops(endpoint: str, bucket: str, threads: int) -> dict[str, Callable]:
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(max_pool_connections=threads, retries={"max_attempts": 1}))
    return {
        "put": lambda k, b: s3.put_object(Bucket=bucket, Key=k, Body=b),
        "head": lambda k: s3.head_object(Bucket=bucket, Key=k)["ContentLength"],
        "get": lambda k: s3.get_object(Bucket=bucket, Key=k)["Body"].read(),
    }


def obstore_ops(endpoint: str, bucket: str, threads: int) -> dict[str, Callable]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, region="us-east-1", virtual_hosted_style_request=False,
                    client_options={"allow_http": True, "pool_max_idle_per_host": str(threads)})
    return {
        "put": lambda k, b: obstore.put(store, k, b),
        "head": lambda k: obstore.head(store, k)["size"],
        "get": lambda k: bytes(obstore.get(store, k).bytes()),
    }


def run(ops: dict[str, Callable], n: int, size: int, threads: int) -> dict[str, float]:
    """Seconds per phase: serial and parallel put, head, get of n objects."""
    body = os.urandom(size)
    out: dict[str, float] = {}
    for mode, workers in (("serial", 1), ("parallel", threads)):
        keys = [f"bench/{uuid.uuid4().hex}/{i:05d}" for i in range(n)]
        for phase in ("put", "head", "get"):
            call = (lambda k: ops["put"](k, body)) if phase == "put" else ops[phase]
            start = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(call, keys))
            out[f"{phase} {mode}"] = time.perf_counter() - start
            if phase == "get":
                assert all(len(r) == size for r in results), "a get came back short"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=500)
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    endpoint = os.environ.get("KVNOTES_S3_ENDPOINT", "http://127.0.0.1:8333")
    bucket = os.environ.get("KVNOTES_STORE_URL", "s3://kvnotes/kv").removeprefix("s3://").split("/")[0]
    size = args.kib * 1024
    print(f"{args.objects} objects x {args.kib} KiB, {args.threads} threads, {endpoint}; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = {name: run(make(endpoint, bucket, args.threads), args.objects, size, args.threads)
            for name, make in (("boto3", boto3_ops), ("obstore", obstore_ops))}
    phases = list(next(iter(rows.values())))
    print(f"| phase | {' | '.join(f'{c} obj/s (MiB/s)' for c in rows)} |")
    print("|---|" + "---|" * len(rows))
    for phase in phases:
        cells = []
        for client in rows:
            s = rows[client][phase]
            rate = args.objects / s
            mib = "" if phase.startswith("head") else f" ({rate * size / 2**20:.0f})"
            cells.append(f"{rate:.0f}{mib}")
        print(f"| {phase} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
