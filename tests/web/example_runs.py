"""The examples' runs, as the worker writes them (no worker): each example of the home page loaded
as a user loads it, then a finished run of every strategy with its notes map and mechanism, whose
answers, verdicts and KL are the example's measured ones (`examples/<slug>.measured.json`, what the
example's model answered) and whose timings are a loaded machine's (wide paired ranges, all above
1×). Used by the slide and speed-up browser tests (issue 51)."""

from __future__ import annotations

import json

from app.web.notebooks.examples import EXAMPLES_DIR, example_slugs, load_example, measured_path
from data.models import RunResult
from tests.web.finished_run import finished_run, mechanism_record

EVERY = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective", "hoist",
         "auto")
# recompute's first token on a loaded 2-core machine (issue 51: 11.24 s on the shipment log), and each
# strategy's median speed-up with its paired range, every round faster than recompute
RECOMPUTE_TTFT_MS = 11240.0
SPEEDUPS = {"prefix_reuse": (1.0, [0.8, 1.3]), "stale": (11.8, [5.5, 33.7]), "in_place": (8.2, [5.1, 22.2]),
            "erratum": (7.6, [4.4, 19.0]), "field_erratum": (6.9, [3.8, 15.1]),
            "selective": (3.1, [2.2, 5.0]), "hoist": (2.9, [2.1, 3.9]), "auto": (4.4, [2.6, 9.9])}


def measured_answers(slug: str) -> dict[str, dict]:
    """What the example's model answered, per strategy (the measured file's records)."""
    stored = json.loads(measured_path(slug, EXAMPLES_DIR).read_text())
    return stored["models"][stored["model"]]["strategies"]


def example_runs(session) -> dict[str, int]:
    """Every example loaded and run by every strategy, in `session`: {slug: run id}."""
    runs = {}
    for slug in example_slugs():
        notebook = load_example(session, slug)
        session.commit()
        run = finished_run(session, notebook, strategies=EVERY, notes_map=True,
                           answers=measured_answers(slug))
        rows = {r.strategy: r for r in session.query(RunResult).filter_by(run_id=run.id)}
        rows["recompute"].ttft_ms = RECOMPUTE_TTFT_MS
        rows["recompute"].ttft_spread_ms = [9800.0, 14100.0]
        for name, (speedup, span) in SPEEDUPS.items():
            rows[name].speedup, rows[name].speedup_range = speedup, span
            rows[name].ttft_ms = round(RECOMPUTE_TTFT_MS / speedup, 1)
        record = mechanism_record()  # the lens read for every strategy, as the worker reads it
        lens = record.logit_lens["recompute"]
        run.mechanism = record.model_copy(update={"logit_lens": {
            name: [p * (0.4 if rows[name].edit_followed == "old" else 1.0) for p in lens] for name in EVERY}})
        session.commit()
        runs[slug] = run.id
    return runs
