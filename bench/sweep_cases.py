"""bench_sweep.py's held-out cases (issue 42): a free answer and 13 choices, beside the yes/no case.

The record is MuSiQue's (`bench.bench_readout.record`: an example's passages laid end to end to about
1,000 tokens, the field the gold answer's first occurrence; nobody here wrote it). Each case is
measured the way bars/31 does: the wall time of an N-value decision-only sweep minus that of a
1-value sweep, per edit, against one warm prefill of the record in the same run, beside what does
not depend on the machine's load, counted by a hook on the model's forward: forwards, inputs (batch ×
length, padding included) and one-token decode steps per edit, and the orders of the choices read.
Each edit's decisions are checked against a timed run of the same edit (what `kvnotes edit` runs).

    free        gemma3-270m, a free answer of up to 6 new tokens; recompute, prefix_reuse, stale,
                in_place, erratum, field_erratum
    choices13   smollm2-135m, 13 choices (8 orders); recompute and the cheap stale, in_place, erratum
"""

from __future__ import annotations

import os
import statistics
import time

CASES = {
    "free": {"model": "gemma3-270m", "choices": 0, "max_new_tokens": 6,
             "strategies": ["recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum"],
             "goal": 1.5},
    "choices13": {"model": "smollm2-135m", "choices": 13, "max_new_tokens": 8,
                  "strategies": ["recompute", "stale", "in_place", "erratum"], "goal": 2.5},
}


def _counted(eng, fn):
    """fn()'s result and the (batch, length) of every forward it made."""
    seen: list[tuple[int, int]] = []
    hook = eng.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        return fn(), seen
    finally:
        hook.remove()


def run_case(name: str, edits: int, check: int) -> dict:
    """One case: prefills, a 1-value and an `edits`-value decision-only sweep, `check` timed runs."""
    from bench.bench_readout import record
    from commands.sweep import run_sweep
    from data.settings import get_settings
    from worker.engine import Field, Question, RunRequest, load
    from worker.engine.strategies import measure

    spec = CASES[name]
    eng = load(spec["model"], device="cpu", data_dir=get_settings().data_dir)
    eng.warm_up()
    rec = record(1000, 13, lambda text: len(eng.tokenize_document(text)[0]))
    choices = tuple(rec["choices"][:spec["choices"]]) if spec["choices"] else ()
    question = Question(rec["question"], choices=choices, max_new_tokens=spec["max_new_tokens"])
    others = [c for c in rec["choices"] if c != rec["old"]]
    values = [others[i % len(others)] for i in range(edits)]
    document, old = rec["document"], rec["old"]
    loads = [os.getloadavg()[0]]
    notes = eng.prefill(document)
    prefills = []
    for _ in range(3):
        t0 = time.perf_counter()
        eng.prefill(document)
        prefills.append(time.perf_counter() - t0)

    def sweep(vals, drafts=True):
        notes.derived.clear()  # each sweep starts afresh: nothing kept from the sweep before
        measure.DRAFTS = drafts
        t0 = time.perf_counter()
        try:
            out, seen = _counted(eng, lambda: run_sweep(eng, document, old, old, vals, question,
                                                          spec["strategies"], timed_edits=0, notes=notes))
        finally:
            measure.DRAFTS = True
        return out, seen, time.perf_counter() - t0

    one, one_seen, one_s = sweep(values[:1])
    loads.append(os.getloadavg()[0])
    many, many_seen, many_s = sweep(values)
    loads.append(os.getloadavg()[0])
    undrafted = None
    if not choices:  # the same sweep with no drafts: what speculative decoding saves, in this run
        bare, bare_seen, bare_s = sweep(values, drafts=False)
        loads.append(os.getloadavg()[0])
        undrafted = {"many_s": bare_s, "per_edit_s": (bare_s - one_s) / (len(values) - 1),
                     "decode_steps": (sum(t == 1 for _, t in bare_seen) - sum(t == 1 for _, t in one_seen))
                     / (len(values) - 1),
                     "same_decisions": [e["decisions"] for e in bare["edits"]]
                     == [e["decisions"] for e in many["edits"]]}
    for _ in range(2):
        t0 = time.perf_counter()
        eng.prefill(document)
        prefills.append(time.perf_counter() - t0)
    prefill = statistics.median(prefills)
    per_edit_s = (many_s - one_s) / (len(values) - 1)
    n = len(values) - 1
    forwards = (len(many_seen) - len(one_seen)) / n
    inputs = (sum(b * t for b, t in many_seen) - sum(b * t for b, t in one_seen)) / n
    steps = (sum(t == 1 for _, t in many_seen) - sum(t == 1 for _, t in one_seen)) / n
    start = document.find(old)
    checked = []
    for value in list(dict.fromkeys(values))[:check]:
        request = RunRequest(document=document, question=question, strategies=tuple(spec["strategies"]),
                             fields=(Field(start, start + len(old), value, old),))
        report = eng.run(request, notes=notes)
        loads.append(os.getloadavg()[0])
        ours = many["edits"][values.index(value)]["decisions"]
        checked.append({"value": value, "sweep": ours,
                        "edit": {k: r.decision for k, r in report.strategies.items()}})
    return {"case": name, **spec, "example": rec["example"], "tokens": rec["tokens"],
            "question": question.text, "choices_listed": list(choices), "values": values,
            "prefill_s": prefills, "one_s": one_s, "many_s": many_s, "per_edit_s": per_edit_s,
            "ratio": per_edit_s / prefill, "forwards": forwards, "inputs": inputs, "decode_steps": steps,
            "orders_read": many.get("orders_read"), "cost": many["cost"], "checked": checked,
            "undrafted": undrafted and {**undrafted, "ratio": undrafted["per_edit_s"] / prefill},
            "loads": loads, "decisions": [e["decisions"] for e in many["edits"]]}


def markdown(results: list[dict]) -> str:
    """The cases' table and how each edit's decisions compare with the timed run's."""
    lines = ["| case | model | strategies | record tokens | edits | one prefill (s) | per edit (s) "
             "| per edit / prefill | goal | forwards per edit | inputs per edit / record tokens "
             "| decode steps per edit | orders read (median, max of 8) | load |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        reads = r["orders_read"]
        orders = f"{reads['median']:g}, {reads['max']}" if reads else "—"
        lines.append(
            f"| {r['case']} | {r['model']} | {', '.join(r['strategies'])} | {r['tokens']} "
            f"| {len(r['values'])} "
            f"| {statistics.median(r['prefill_s']):.2f} | {r['per_edit_s']:.2f} | {r['ratio']:.2f}× "
            f"| ≤ {r['goal']}× | {r['forwards']:.1f} | {r['inputs'] / r['tokens']:.2f}× "
            f"| {r['decode_steps']:.1f} | {orders} | {min(r['loads']):.1f}–{max(r['loads']):.1f} |")
    lines.append("")
    for r in results:
        bare = r.get("undrafted")
        if bare:
            same = "the same" if bare["same_decisions"] else "DIFFERENT"
            lines.append(f"- {r['case']} without drafts (the same sweep, this run): "
                         f"{bare['per_edit_s']:.2f} s per edit, {bare['ratio']:.2f}× one prefill, "
                         f"{bare['decode_steps']:.1f} decode steps per edit; decisions {same} as with drafts")
    for r in results:
        same = sum(c["sweep"][k] == c["edit"].get(k) for c in r["checked"] for k in c["sweep"])
        total = sum(len(c["sweep"]) for c in r["checked"])
        lines.append(f"- {r['case']}: {same} of {total} decisions equal a timed run's of the same edit "
                     f"({len(r['checked'])} values); record: MuSiQue example {r['example']}, question "
                     f"\"{r['question']}\"")
    return "\n".join(lines)
