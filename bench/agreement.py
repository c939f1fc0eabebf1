"""Agreement with recompute over field edits fixed in advance (`documents.AGREEMENT_CASES`): does
each strategy reach recompute's decision, and how far is its next-token distribution (KL)?"""

from __future__ import annotations

import statistics

from documents import AGREEMENT_CASES, build

from worker.engine import STRATEGIES, Field, Question


def fmt_kl(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3f}"


def run_agreement(eng) -> str:
    names = [s for s in STRATEGIES if s != "recompute"]
    match = {s: 0 for s in names}
    kls = {s: [] for s in names}
    per_case = ["| case | tokens | field | choices | recompute old → new | " + " | ".join(names) + " |",
                "|---|---:|---|---|---|" + "|".join([":-:"] * len(names)) + "|"]
    flips = 0
    for case in AGREEMENT_CASES:
        doc, field, question = build(eng, case)
        notes = eng.prefill(doc)
        old_q = Question(question.text, question.choices)
        # recompute's decision on the OLD document: does the edit flip it at all?
        base = eng.edit(notes, [Field(field.start, field.end, doc[field.start:field.end], field.label)],
                        old_q, strategies=["recompute"]).strategies["recompute"].decision
        rep = eng.edit(notes, [field], question, strategies=list(STRATEGIES))
        rec = rep.strategies["recompute"].decision
        flips += base.strip().lower() != rec.strip().lower()
        cells = []
        for s in names:
            r = rep.strategies[s]
            match[s] += r.decision_matches_recompute
            kls[s].append(r.kl_to_recompute)
            cells.append(("✓" if r.decision_matches_recompute else "✗") + f" {r.decision}")
        per_case.append(f"| {case.name} | {rep.document_tokens} | {case.edit_label}: "
                        f"{doc[field.start:field.end]} → {field.new_value} | {', '.join(case.choices)} | "
                        f"{base} → {rec} | " + " | ".join(cells) + " |")
    n = len(AGREEMENT_CASES)
    summary = ["| strategy | decisions matching recompute | mean KL to recompute | median KL |",
               "|---|---:|---:|---:|"]
    for s in names:
        summary.append(f"| {s} | {match[s]}/{n} | {fmt_kl(statistics.mean(kls[s]))} | "
                       f"{fmt_kl(statistics.median(kls[s]))} |")
    return (f"Recompute's decision flipped with the edit in **{flips}/{n}** cases (a strategy that keeps the "
            f"old notes can only 'match' where recompute did not flip).\n\n" + "\n".join(summary) + "\n\n"
            "Per case (✓ = same decision as recompute on the edited document):\n\n"
            + "\n".join(per_case) + "\n")
