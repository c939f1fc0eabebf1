"""A run as data, for `/runs/{id}/export.json` (everything the run page shows) and
`/runs/{id}/export.csv` (the decision table). The JSON holds the API's run (snapshot, every
strategy's metrics, the notes map), the page's verdicts (agreement, the note, speed-ups, answers
word by word against recompute), and an attention summary: per strategy its tokens, the decision's
attention averaged over layers and heads, and how far each head moved from recompute's; plus
the view the link names, drawn exactly as on the page."""

from __future__ import annotations

import csv
import io
from typing import Any

from sqlalchemy.orm import Session

from app.services.attention import (
    NoAttention,
    attention_vector,
    compare_heads,
    results_with_attention,
)
from app.services.run_view import run_view
from app.web.runs.heatmap_view import ViewParams, heatmap_panels
from data.models import Run
from vocabulary import REFERENCE

EXPORT_VERSION = 1


def _floats(values, digits: int = 6) -> list[float]:
    return [round(float(v), digits) for v in values]


def attention_summary(session: Session, run: Run) -> dict[str, Any]:
    results = results_with_attention(session, run.id)
    reference = results.get(REFERENCE)
    out: dict[str, Any] = {}
    for name, result in results.items():
        if result.attention is None:
            continue
        mean = attention_vector(result, name)
        entry: dict[str, Any] = {
            "shape": mean.shape, "decision_index": mean.decision, "query_start": mean.query_start,
            "tokens": [t.model_dump() for t in mean.tokens], "decision_mean": _floats(mean.values),
        }
        if name != REFERENCE:
            try:
                compared = compare_heads(result, reference, name)
                entry["map_to_recompute"] = compared.mapping
                entry["head_diff"] = [_floats(row, 5) for row in compared.head_diff]
            except (NoAttention, ValueError):
                pass
        out[name] = entry
    return out


def view_data(session: Session, run: Run, params: ViewParams) -> dict[str, Any]:
    panels = heatmap_panels(session, run.id, params)
    return {
        "strategy": params.strategy, "layer": params.layer, "head": params.head, "agg": params.agg,
        "query": params.query, "label": params.label, "scale_max": round(panels.vmax, 6),
        "difference_max": round(panels.dmax, 6),
        REFERENCE: _floats(panels.ref_values), "values": _floats(panels.res_values),
        "difference": [round(c.value, 6) for c in panels.diff],
        "top_tokens": [{"rank": t.rank, "text": t.text, "segment": t.segment, REFERENCE: t.recompute,
                        "strategy": t.strategy} for t in panels.top],
    }


def run_json(session: Session, run: Run, context: dict[str, Any],
             params: ViewParams | None) -> dict[str, Any]:
    rows = context["rows"]
    return {
        "kvnotes_export": EXPORT_VERSION,
        "permalink": f"/runs/{run.id}" + (f"?{params.query_string()}" if params else ""),
        "notebook": ({"id": context["notebook"].id, "title": context["notebook"].title}
                     if context["notebook"] else None),
        "run": run_view(session, run).model_dump(mode="json"),  # the API's run, the same object
        "verdict": {
            "agree": context["agree"], "compared": context["compared"], "note": context["note"],
            "default_strategy": context["default_strategy"],
            "speedup_on": "ttft" if context["ttft_measured"] else "latency",
        },
        "decisions": [decision_record(row, context["decode_measured"]) for row in rows],
        "answers": [{"strategy": a.row.strategy, "same_as_recompute": a.same,
                     "diff": [{"op": op, "text": text} for op, text in a.diff]}
                    for a in context.answers],
        "attention": attention_summary(session, run) if context["attention_strategies"] else {},
        "view": view_data(session, run, params) if params else None,
        "notes_map": run.attribution.model_dump() if run.attribution else None,
    }


def decision_record(row, decoded: bool = True) -> dict[str, Any]:
    """One strategy's row of the exports; `decoded`: the run timed decoding (else decode_ms is None,
    as the page leaves it out: `view.measured_decode`)."""
    r = row.result
    record = {"strategy": row.strategy, "is_reference": row.is_reference, "same_decision": row.agrees,
              "edit_followed": row.followed, "tokens_pct": row.tokens_pct, "speedup": row.speedup,
              "too_short_to_time": row.timing is not None and row.timing.kind == "short",
              "speedup_note": row.timing.label if row.timing is not None else None,
              "speedup_range": list(row.speedup_range) if row.speedup_range else None}
    if r is not None:
        record.update(decision=r.decision, choice_probs=r.choice_probs, answer_f1=r.answer_f1,
                      recompute_answer_nll=r.recompute_answer_nll, kl_to_recompute=r.kl_to_recompute,
                      top1_agrees=r.top1_agrees, topk_overlap=r.topk_overlap,
                      tokens_computed=r.tokens_computed,
                      prefix_cache_share=r.prefix_cache_share, ttft_ms=r.ttft_ms,
                      ttft_spread_ms=r.ttft_spread_ms, decode_ms=r.decode_ms if decoded else None,
                      latency_ms=r.latency_ms,
                      text=r.text, choice_spread=r.choice_spread or {}, order_bias=r.order_bias)
    return record


CSV_COLUMNS = ["strategy", "decision", "same_decision", "edit_followed", "choice_probs", "answer_f1",
               "recompute_answer_nll", "kl_to_recompute", "top1_agrees", "topk_overlap", "tokens_computed",
               "tokens_pct", "prefix_cache_share", "ttft_ms", "ttft_spread_ms", "decode_ms", "latency_ms",
               "speedup", "speedup_range", "speedup_note", "too_short_to_time", "choice_spread", "order_bias"]
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A cell a spreadsheet will not run: text starting like a formula gets a leading quote."""
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    if isinstance(value, float):
        return round(value, 6)
    return "" if value is None else value


def run_csv(rows, decoded: bool = True) -> str:
    """The decision table, one row per strategy (recompute first), columns as named in the header
    (`decoded`: as `decision_record`'s)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        record = decision_record(row, decoded)
        probs = record.get("choice_probs") or {}
        record["choice_probs"] = "; ".join(f"{k}: {v:.4f}" for k, v in probs.items())
        spread = record.get("ttft_spread_ms")
        record["ttft_spread_ms"] = f"{spread[0]:.3f}-{spread[1]:.3f}" if spread else None
        paired = record.get("speedup_range")
        record["speedup_range"] = f"{paired[0]:.2f}-{paired[1]:.2f}" if paired else None
        orders = record.get("choice_spread") or {}
        record["choice_spread"] = "; ".join(f"{k}: {lo:.4f}-{hi:.4f}" for k, (lo, hi) in orders.items())
        writer.writerow([_cell(record.get(name)) for name in CSV_COLUMNS])
    return out.getvalue()
