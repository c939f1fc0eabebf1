"""`kvnotes store`: the KV store's tiers, each with its size, hits, misses and evictions (issue 40).

    kvnotes store [--store s3://BUCKET/PREFIX] [--verify] [--json]

The local tier is this host's `<KVNOTES_DATA>/kv` (its counters are every process's on this host:
they live in its index). The shared tier's size and counters are every worker's, from its index in
Redis (KVNOTES_STORE_INDEX, else the broker's): with the uploads dropped (a full upload queue, or
the bucket down) and the bytes waiting in the workers' upload queues now. `reachable` says whether
its bucket answered now; `--verify` also counts the objects and bytes the bucket holds (a listing),
beside what the index says.
"""

from __future__ import annotations

import argparse
import json


def tiers(url: str = "", verify: bool = False) -> list[dict]:
    """One row per tier: name, where, objects, bytes, hits, misses, evictions (and more)."""
    from worker.engine.store_s3 import TierFault
    from worker.runtime import open_store

    store = open_store(url)
    local = store.stats()
    rows = [{"tier": "local", "where": str(store.root), "objects": local.get("blocks", 0),
             "bytes": local.get("bytes", 0), "hits": local.get("hits", 0), "misses": local.get("misses", 0),
             "evictions": local.get("evictions", 0), "corrupt": local.get("corrupt", 0),
             "budget_bytes": store.budget_bytes}]
    if store.shared is not None:
        shared = store.shared_stats()
        try:
            store.shared.tier.get(store.shared.tier.path("seq", "0" * 64))  # any answer, a miss included
            reachable = "yes"
        except TierFault as fault:
            reachable = f"no: {fault.reason}"
        rows.append({"tier": "shared", "where": str(shared["url"]), "objects": shared.get("objects", 0),
                     "bytes": shared.get("bytes", 0), "hits": shared.get("hits", 0),
                     "misses": shared.get("misses", 0), "evictions": shared.get("evictions", 0),
                     "damaged": shared.get("damaged", 0), "budget_bytes": shared["budget_bytes"],
                     "dropped": shared.get("dropped", 0), "queued_bytes": shared.get("queued_bytes", 0),
                     "upload_bytes": shared["upload_bytes"],
                     "reachable": reachable, "indexed": store.shared.index is not None})
        if verify:
            try:
                rows[-1]["bucket_objects"], rows[-1]["bucket_bytes"] = store.shared.tier.count_objects()
            except TierFault as fault:
                rows[-1]["bucket_objects"] = rows[-1]["bucket_bytes"] = None
                rows[-1]["reachable"] = f"no: {fault.reason}"
    store.close(drain=False, timeout_s=0)
    return rows


def cmd_store(args) -> None:
    rows = tiers(args.store or "", verify=args.verify)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'tier':<7} {'objects':>8} {'MiB':>9} {'budget MiB':>11} {'hits':>8} {'misses':>8} "
          f"{'evictions':>9}  where")
    for r in rows:
        extra = ""
        if r["tier"] == "shared":
            extra = f" (reachable: {r['reachable']}" + ("" if r["indexed"] else "; no index: no budget") + ")"
        mib, budget = r["bytes"] / 2**20, r["budget_bytes"] / 2**20
        print(f"{r['tier']:<7} {r['objects']:>8} {mib:>9.1f} {budget:>11.0f} {r['hits']:>8}"
              f" {r['misses']:>8} {r['evictions']:>9}  {r['where']}{extra}")
    for r in rows:
        if r["tier"] != "shared":
            continue
        print(f"uploads: {r['dropped']} dropped; {r['queued_bytes'] / 2**20:.1f} MiB queued in the workers "
              f"(bound {r['upload_bytes'] / 2**20:.0f} MiB each)")
        if "bucket_objects" in r:
            held = "unknown (unreachable)" if r["bucket_objects"] is None else \
                f"{r['bucket_objects']} objects, {r['bucket_bytes'] / 2**20:.1f} MiB"
            print(f"bucket (listed): {held}; the index says {r['objects']} objects, "
                  f"{r['bytes'] / 2**20:.1f} MiB")


def add_command(sub) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "store", help="the KV store's tiers (local folder, shared S3 tier): size, hits, misses, evictions")
    p.add_argument("--store", default=None, metavar="s3://BUCKET/PREFIX",
                   help="the shared tier (default: KVNOTES_STORE_URL; unset: the local tier only)")
    p.add_argument("--verify", action="store_true",
                   help="also list the bucket: its objects and bytes beside what the index says")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_store)
