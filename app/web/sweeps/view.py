"""What the sweep page exports from the one `SweepView`: the CSV (one row per edit and strategy);
the frontier is drawn by `app.web.sweeps.frontier` (`frontier_svg`, re-exported here)."""

from __future__ import annotations

import csv
import io
import json

from app.services.sweep_view import SweepView
from app.web.sweeps.frontier import frontier_svg

__all__ = ["CSV_COLUMNS", "csv_text", "frontier_svg"]

CSV_COLUMNS = ("sweep_id", "position", "run_id", "status", "field", "values", "expected", "strategy",
               "decision", "edit_followed", "agrees_with_recompute", "changed", "kl_to_recompute",
               "tokens_computed", "ttft_ms", "prefix_cache_share", "attempts")


def csv_text(view: SweepView) -> str:
    """One row per edit and strategy, with a header; an edit without results has one row per
    strategy asked, its status saying why it has none."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for edit in view.edits:
        for name in view.strategies:
            r = edit.results.get(name)
            writer.writerow([view.id, edit.position, edit.run_id, edit.status, edit.field,
                             json.dumps(edit.values, ensure_ascii=False), edit.expected or "", name,
                             r.decision if r else "", (r.edit_followed or "") if r else "",
                             "" if r is None or r.agrees is None else int(r.agrees),
                             "" if edit.changed is None else int(edit.changed),
                             r.kl_to_recompute if r else "", r.tokens_computed if r else "",
                             r.ttft_ms if r else "", r.prefix_cache_share if r else "", edit.attempts])
    return buffer.getvalue()
