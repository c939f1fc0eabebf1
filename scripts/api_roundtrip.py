"""Drive a running kvnotes over its HTTP JSON API, the way an outside client would, and compare the
queue path with a direct engine call on the same spec, side by side.

    .venv/bin/python scripts/api_roundtrip.py [--url http://127.0.0.1:8000] [--model smollm2-135m] [--direct]
        [--repeats 1]

Creates a notebook from examples/shipment-log.json, adds its field, starts a run with every
strategy, prints progress as it moves, then the metrics read back. With --direct it also runs the
same spec through `worker.engine` in this process (after loading and a warm-up) and prints both
timings: the queue path's overhead is the difference. With --repeats N the queued run (after one
warm-up run) and the direct call are each done N times, alternating, and medians are reported;
beside them, each queued run's own overhead: its wall time from POST to `succeeded` minus the time
the worker spent inside `Engine.run` for it (`timings.engine_ms`), which a busy machine moves far
less than the difference of two separate runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx

from vocabulary import STRATEGIES

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "shipment-log.json"


def queued_run(api: httpx.Client, nb_id: int, ex: dict, verbose: bool) -> tuple[float, dict]:
    """POST a run, poll it every 0.2 s until it ends; (wall seconds, the run as read back)."""
    t0 = time.perf_counter()
    run = api.post(f"/notebooks/{nb_id}/runs",
                   json={"question": ex["question"], "choices": ex["choices"],
                         "strategies": list(STRATEGIES)})
    run.raise_for_status()
    run = run.json()
    seen = None
    while run["status"] in ("queued", "running"):
        time.sleep(0.2)
        run = api.get(f"/runs/{run['id']}").json()
        if verbose and (run["stage"], round(run["progress"], 2)) != seen:
            seen = (run["stage"], round(run["progress"], 2))
            print(f"  {time.perf_counter() - t0:6.2f}s  {run['status']:<9} "
                  f"{run['stage'] or '':<24} {run['progress']:.2f}")
    wall = time.perf_counter() - t0
    if run["status"] != "succeeded":
        raise SystemExit(f"run {run['id']} {run['status']}: {run['error']}")
    return wall, run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--direct", action="store_true", help="also run the spec through the engine directly")
    ap.add_argument("--repeats", type=int, default=1,
                    help="queued runs and direct calls to take medians over")
    args = ap.parse_args()
    ex = json.loads(EXAMPLE.read_text())
    api = httpx.Client(base_url=args.url + "/api", timeout=30)

    nb = api.post("/notebooks", json={"title": ex["title"], "model": args.model,
                                      "text": ex["document"]}).json()
    f = ex["fields"][0]
    start = ex["document"].index(f["find"])
    api.post(f"/notebooks/{nb['id']}/fields",
             json={"start": start, "end": start + len(f["find"]), "new_value": f["new_value"],
                   "label": f["label"]})
    queue_s, run = queued_run(api, nb["id"], ex, verbose=True)
    print(f"\nrun {run['id']} via the queue: {queue_s * 1000:.0f} ms from POST to succeeded; "
          f"timings {run['timings']}")
    print(f"{'strategy':<14} {'decision':<8} {'KL':>8} {'tokens':>7} {'ms':>8}")
    for name, r in run["results"].items():
        print(f"{name:<14} {r['decision']:<8} {r['kl_to_recompute']:>8.4f} "
              f"{r['tokens_computed']:>7} {r['latency_ms']:>8.1f}")
    if not args.direct:
        return
    import tempfile

    from data.settings import get_settings
    from worker.engine import Field, Question, RunRequest, load
    from worker.engine.store import KVStore

    # like the worker, the direct engine has a KV store: after the warm-up both read the document's
    # notes from a store instead of prefilling them
    store = KVStore(Path(tempfile.mkdtemp(prefix="kvnotes-direct-")))
    eng = load(args.model, device="cpu", store=store, data_dir=get_settings().data_dir)
    fields = (Field(start, start + len(f["find"]), f["new_value"], f["label"]),)
    request = RunRequest(ex["document"], Question(ex["question"], tuple(ex["choices"])), fields=fields,
                         strategies=STRATEGIES, attention=True)
    eng.run(request)  # warm-up
    queued, direct, own = [], [], []
    for _ in range(max(1, args.repeats)):
        if args.repeats > 1 or not queued:
            wall, run = queued_run(api, nb["id"], ex, verbose=False) if args.repeats > 1 else (queue_s, run)
            queued.append(wall)
            own.append(wall - run["timings"]["engine_ms"] / 1000)
        t1 = time.perf_counter()
        report = eng.run(request)
        direct.append(time.perf_counter() - t1)
    q, d, o = statistics.median(queued), statistics.median(direct), statistics.median(own)
    same = all(report.strategies[n].decision == run["results"][n]["decision"] for n in report.strategies)
    print(f"\n| path | wall ms (median of {len(queued)}) |\n| --- | ---: |"
          f"\n| queue: POST → `succeeded` (polling 0.2 s) | {q * 1000:.0f} |"
          f"\n| direct `eng.run` (same spec, same attention) | {d * 1000:.0f} |"
          f"\n| overhead: queue − direct | {(q - d) * 1000:.0f} ({q / d:.2f}×) |"
          f"\n| overhead: each queued run's wall − its own `engine_ms` | {o * 1000:.0f} |"
          f"\n| budget: 10% of direct + 150 ms | {(0.1 * d + 0.15) * 1000:.0f} |")
    print(f"queued runs' timings: {run['timings']}; decisions identical on both paths: {same}")


if __name__ == "__main__":
    main()
