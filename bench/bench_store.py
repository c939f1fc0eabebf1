"""The KV store's shared tier (issue 40): a document prefilled on host A read back on host B, and a
compiled skill spliced on B, against computing them there.

    eval "$(scripts/s3.sh --port 18400 --dir /tmp/s3-bench --detach)"
    .venv/bin/python bench/bench_store.py [--model smollm2-135m] [--tokens 2000] [--repeats 3]

Two KV stores with separate local folders (hosts A and B) behind one SeaweedFS bucket, one loaded
model (B is A's process with B's store: the same weights, as on two hosts). Per repeat, under a
fresh prefix:
- A prefills the document (its notes go to A's folder and, in the background, to the bucket);
- B's time to the document's notes: from the shared tier (fetched, verified, kept locally) against
  prefilling them on B with no store, and again from B's own folder;
- a skill compiled on A (`save_skill`), fetched by its key on B (`stored_skill`) and spliced into a
  context, against compiling it on B.
Prints the medians (ms), the tokens read from each tier and the bytes fetched, and `uptime`'s load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TEXT = ("Account record. status: active. owner: Ada Lovelace. region: north. The account was opened in "
        "March and has been reviewed twice since then; every review found the records complete. ")
SKILL = ("When you answer, first restate the field that decides the question, then say which rule applies, "
         "and answer with one of the choices only. ") * 6


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - start) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/kvnotes-bench-store")
    args = ap.parse_args()

    from worker.engine import load
    from worker.engine.compose import Placement
    from worker.engine.store import KVStore
    from worker.engine.store_s3 import SharedConfig
    from worker.engine.store_tiers import SharedIndex

    endpoint = os.environ.get("KVNOTES_S3_ENDPOINT", "http://127.0.0.1:8333")
    base = os.environ.get("KVNOTES_STORE_URL", "s3://kvnotes/kv")
    index = os.environ.get("KVNOTES_STORE_INDEX", "redis://127.0.0.1:6379/0")
    eng = load(args.model, device="cpu", data_dir=REPO / "var" / "test-data")
    eng.warm_up()
    ids = eng.encode(TEXT * (args.tokens // 20 + 1))[: args.tokens]
    document = eng.tokenizer.decode(ids)
    context = eng.prefill("Account record. status: active.")
    rows: dict[str, list[float]] = {}
    counts: dict[str, int] = {}

    def note(name: str, ms: float) -> None:
        rows.setdefault(name, []).append(ms)

    for r in range(args.repeats):
        url = f"{base}/bench-{uuid.uuid4().hex[:8]}"
        work = Path(args.work) / f"{r}-{uuid.uuid4().hex[:6]}"
        config = SharedConfig(url=url, endpoint=endpoint, index_url=index)
        a, b = KVStore(work / "a", shared=config), KVStore(work / "b", shared=config)

        eng.store = None
        notes, ms = timed(eng.prefill, document)
        note("prefill on B, no store (recompute)", ms)
        n_tokens = len(notes.token_ids)

        eng.store = a
        _, ms = timed(eng.prefill, document)
        note("prefill on A (writes local + shared in background)", ms)
        skill_notes, ms = timed(eng.compile_skill, SKILL)
        note("compile the skill on B, no store", ms)
        key = eng.save_skill(skill_notes)
        a.flush(120)

        eng.store = b
        _, ms = timed(eng.prefill, document)
        note("B: document notes from the shared tier", ms)
        counts["document tokens"] = n_tokens
        counts["tokens read from the shared tier"] = eng.last_reuse.tokens
        kept = (work / "b" / "blocks").rglob("*.safetensors")
        counts["bytes fetched"] = sum(p.stat().st_size for p in kept)
        _, ms = timed(eng.prefill, document)
        note("B: document notes from B's own folder", ms)
        assert eng.last_reuse.tier == "local"

        stored, ms = timed(eng.stored_skill, key, SKILL)
        note("B: skill fetched by its key (shared tier)", ms)
        assert stored is not None and torch.equal(stored.layers[0][0], skill_notes.layers[0][0])
        _, ms = timed(eng.compose_notes, context, [Placement(SKILL, None, stored)])
        note("B: splice the fetched skill into a context", ms)
        counts["skill tokens"] = len(stored.token_ids)
        SharedIndex(index, url.removeprefix("s3://")).clear()

    load1, load5, _ = os.getloadavg()
    print(f"{args.model} on CPU, {args.repeats} repeats, medians; "
          f"load average {load1:.1f} (5 min {load5:.1f})")
    print("| step | ms |")
    print("|---|---:|")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.0f} |")
    print()
    print("| counted | value |")
    print("|---|---:|")
    for name, value in counts.items():
        print(f"| {name} | {value:,} |")


if __name__ == "__main__":
    main()
