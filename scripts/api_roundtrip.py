"""Drive a running kvnotes over its HTTP JSON API, the way an outside client would, and compare the
queue path with a direct engine call on the same spec, side by side.

    .venv/bin/python scripts/api_roundtrip.py [--url http://127.0.0.1:8000] [--model smollm2-135m] [--direct]

Creates a notebook from examples/shipment-log.json, adds its field, starts a run with every
strategy, prints progress as it moves, then the metrics read back. With --direct it also runs the
same spec through `worker.engine` in this process (after loading and a warm-up) and prints both
timings: the queue path's overhead is the difference.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from worker.engine.vocabulary import STRATEGIES

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "shipment-log.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--direct", action="store_true", help="also run the spec through the engine directly")
    args = ap.parse_args()
    ex = json.loads(EXAMPLE.read_text())
    api = httpx.Client(base_url=args.url + "/api", timeout=30)

    nb = api.post("/notebooks", json={"title": ex["title"], "model": args.model, "text": ex["document"]}).json()
    f = ex["fields"][0]
    start = ex["document"].index(f["find"])
    api.post(f"/notebooks/{nb['id']}/fields",
             json={"start": start, "end": start + len(f["find"]), "new_value": f["new_value"], "label": f["label"]})
    t0 = time.perf_counter()
    run = api.post(f"/notebooks/{nb['id']}/runs",
                   json={"question": ex["question"], "choices": ex["choices"], "strategies": list(STRATEGIES)})
    run.raise_for_status()
    run = run.json()
    seen = None
    while run["status"] in ("queued", "running"):
        time.sleep(0.2)
        run = api.get(f"/runs/{run['id']}").json()
        if (run["stage"], round(run["progress"], 2)) != seen:
            seen = (run["stage"], round(run["progress"], 2))
            print(f"  {time.perf_counter() - t0:6.2f}s  {run['status']:<9} {run['stage'] or '':<24} {run['progress']:.2f}")
    queue_s = time.perf_counter() - t0
    if run["status"] != "succeeded":
        raise SystemExit(f"run {run['id']} {run['status']}: {run['error']}")
    print(f"\nrun {run['id']} via the queue: {queue_s * 1000:.0f} ms from POST to succeeded; timings {run['timings']}")
    print(f"{'strategy':<14} {'decision':<8} {'KL':>8} {'tokens':>7} {'ms':>8}")
    for name, r in run["results"].items():
        print(f"{name:<14} {r['decision']:<8} {r['kl_to_recompute']:>8.4f} {r['tokens_computed']:>7} {r['latency_ms']:>8.1f}")

    if args.direct:
        from data.settings import get_settings
        from worker.engine import Field, Question, RunRequest, load

        eng = load(args.model, device="cpu", data_dir=get_settings().data_dir)
        fields = (Field(start, start + len(f["find"]), f["new_value"], f["label"]),)
        request = RunRequest(ex["document"], Question(ex["question"], tuple(ex["choices"])), fields=fields,
                             strategies=STRATEGIES, attention=True)
        eng.run(request)  # warm-up
        t1 = time.perf_counter()
        report = eng.run(request)
        direct_s = time.perf_counter() - t1
        same = all(report.strategies[n].decision == run["results"][n]["decision"] for n in report.strategies)
        print(f"\n| path | wall ms |\n| --- | --- |\n| queue (POST → succeeded, polling 0.2 s) | {queue_s * 1000:.0f} |"
              f"\n| direct `eng.run` (same spec, same attention) | {direct_s * 1000:.0f} |"
              f"\n| overhead | {(queue_s - direct_s) * 1000:.0f} ({queue_s / direct_s:.2f}×) |")
        print(f"decisions identical on both paths: {same}")


if __name__ == "__main__":
    main()
