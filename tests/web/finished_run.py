"""A finished run written straight into the database (no worker): the rows the run page, the
heatmap and the notebook's token hover read. Used by the page and browser tests."""

from __future__ import annotations

import re

import numpy as np
from sqlalchemy.orm import Session

from app.services.runs import build_snapshot
from data.models import Notebook, Run, RunResult
from vocabulary import render_erratum
from vocabulary.verdicts import edit_followed

LAYERS, HEADS = 4, 6


def tokens_of(document: str, frame: int = 3, tail: list[tuple[str, str]] | None = None) -> list[dict]:
    """Word-ish tokens of `document` with offsets, after `frame` frame tokens, then `tail`."""
    out = [{"id": 1 + i, "text": f"<f{i}>", "start": -1, "end": -1, "segment": "frame"} for i in range(frame)]
    for m in re.finditer(r"\s*\S+", document):
        out.append({"id": 100 + len(out), "text": m.group(), "start": m.start(), "end": m.end(),
                    "segment": "document"})
    for text, segment in tail or []:
        out.append({"id": 900 + len(out), "text": text, "start": -1, "end": -1, "segment": segment})
    return out


def attention_for(tokens: list[dict], seed: int) -> tuple[bytes, list[int]]:
    rng = np.random.default_rng(seed)
    w = rng.random((LAYERS, HEADS, len(tokens))).astype(np.float32) ** 4
    w[:, :, 0] += 2.0  # the attention sink
    w /= w.sum(-1, keepdims=True)
    return w.astype(np.float16).tobytes(), [LAYERS, HEADS, len(tokens)]


def queries_for(tokens: list[dict], start: int, seed: int) -> bytes:
    """float16 [T - start, T]: each question/answer token's attention over the tokens up to itself."""
    rng = np.random.default_rng(seed + 100)
    n = len(tokens)
    q = rng.random((n - start, n)).astype(np.float32) ** 4
    for row in range(n - start):
        q[row, start + row + 1 :] = 0
        q[row, 0] += 2.0
    q /= q.sum(-1, keepdims=True)
    return q.astype(np.float16).tobytes()


NOTES_MAP = {"field_share": 0.94, "kl_stale": 1.7, "kl_in_place": 0.1, "spans": []}


def finished_run(session: Session, notebook: Notebook, strategies=("recompute", "stale", "field_erratum"),
                 notes_map: bool = False, answers: dict[str, dict] | None = None) -> Run:
    """A succeeded run of `notebook` (which must have a question) with plausible results: the
    question's tokens, an answer token, the decision's and every query's attention, and (with
    `notes_map`) a notes map whose spans cover the document after the first field.

    answers: per strategy, what a real run answered (`examples/<slug>.measured.json`'s records:
    answer, edit_followed, same_decision, kl); then the erratum strategies' notes end with the
    erratum the engine writes, word by word."""
    snapshot = build_snapshot(notebook, notebook.question, list(strategies), attribution=notes_map)
    run = Run(notebook_id=notebook.id, snapshot=snapshot, strategies=list(strategies), status="succeeded",
              stage="done", progress=1.0, timings={"prefill": 420.0, "readout": 35.0})
    if notes_map and notebook.fields:
        first = min(f.start for f in notebook.fields)
        doc = notebook.document
        cuts = list(range(first, len(doc), 24)) + [len(doc)]
        spans = [{"start_char": a, "end_char": b, "text": doc[a:b], "share": round(0.3 / (1 + i), 3) - 0.02}
                 for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
        spans[-1]["share"] = -0.05  # a patch can also move the decision away from recompute
        run.attribution = {**NOTES_MAP, "spans": spans}
    session.add(run)
    session.flush()
    old_doc = notebook.document
    fields = notebook.fields
    new_doc = old_doc
    for f in sorted(fields, key=lambda f: -f.start):
        new_doc = new_doc[: f.start] + f.new_value + new_doc[f.end :]
    choices = list(notebook.question.choices) or []
    for k, name in enumerate(strategies):
        agrees = name != "stale"
        question = [("Question", "question"), (":", "question"), (" status", "question"), ("?", "question")]
        answer = [(" Yes" if agrees else " No", "answer")]
        if name == "stale":
            toks = tokens_of(old_doc, tail=question + answer)
        elif name in ("erratum", "field_erratum"):
            errata = ([(" [STATE UPDATE]", "erratum"), (" changed", "erratum")] if answers is None else
                      [(w, "erratum") for f in fields
                       for w in re.findall(r"\s*\S+", render_erratum(f.label, f.old_value, f.new_value))])
            toks = tokens_of(new_doc if name == "field_erratum" else old_doc,
                             tail=[*errata, *question, *answer])
        else:
            toks = tokens_of(new_doc, tail=question + answer)
        blob, shape = attention_for(toks, seed=k)
        query_start = len(toks) - len(question) - len(answer)
        probs = {c: (0.8 if (i == 1) == agrees else 0.2) for i, c in enumerate(choices[:2])}
        decision = (max(probs, key=probs.get) if probs
                    else ("The status is suspended." if agrees else "The status is active."))
        real = (answers or {}).get(name)
        if real is not None:
            agrees, decision = real["same_decision"], real["answer"]
            probs = {c: (0.8 if c == decision else 0.2) for c in choices[:2]}
        session.add(RunResult(
            run_id=run.id, strategy=name, decision=decision, choice_probs=probs,
            kl_to_recompute=real["kl"] if real else (0.0 if name == "recompute" else (1.7 if name == "stale"
                                                                                       else 0.012)),
            top1_agrees=agrees, topk_overlap=10 if agrees else 6, logit_cosine=0.99,
            decision_matches_recompute=agrees,
            edit_followed=(edit_followed(decision, [f.old_value for f in fields],
                                         [f.new_value for f in fields], choices)
                           if fields else None),  # as the worker stores it
            tokens_computed=len(toks) if name == "recompute" else (0 if name == "stale" else 24),
            latency_ms=480.0 if name == "recompute" else (3.0 if name == "stale" else 41.0),
            ttft_ms=470.0 if name == "recompute" else (2.5 if name == "stale" else 40.0), decode_ms=0.5,
            answer_f1=1.0 if agrees else 0.0, recompute_answer_nll=0.2 if agrees else 2.3,
            prefix_cache_share=0.97 if name in ("stale", "erratum") else 0.02,
            text="" if probs else decision, detail="", attention=blob, attention_shape=shape, tokens=toks,
            decision_index=len(toks) - len(answer) - 1, query_start=query_start,
            query_attention=queries_for(toks, query_start, seed=k),
        ))
    session.commit()
    return run


def mechanism_record():
    """A mechanism record as the worker stores one: a knockout row, a selective@K curve, a 30-layer lens."""
    from data.contracts import KCurve, KnockoutRow, KPoint, MechanismRecord, MechControl, MechReading

    reading = MechReading(decision="suspended", p_answer=0.4, kl=0.0123)
    control = MechControl(size=8, draws=5, p_answer=0.7, p_answer_spread=0.01, kl=0.01, kl_spread=0.0,
                          agreement=0.8)
    rows = [KnockoutRow(strategy="recompute", region="downstream_top10", layers="all", size=8,
                        control=control, reading=MechReading(decision="active", p_answer=0.2, kl=0.9),
                        agrees=False)]
    points = [KPoint(k=k, reading=reading, agrees=k >= 4) for k in (0, 1, 2, 4, 8, 11)]
    lens = [min(1.0, (i / 29) ** 3) for i in range(30)]
    return MechanismRecord(answer="sus", decision="suspended", shown="stale",
                           unmasked={"recompute": MechReading(decision="suspended", p_answer=0.4, kl=0.0)},
                           knockout=rows, downstream=11,
                           selective_k=[KCurve(ranking="notes_map", points=[], k_star=None,
                                               note="the notes map was not measured on this run"),
                                        KCurve(ranking="attention", points=points, k_star=4)],
                           logit_lens={"recompute": lens, "stale": [p / 2 for p in lens]},
                           costs={"knockout": 0.4, "selective_k": 10.5, "logit_lens": 0.1})


SWEEP_DOC = "Customer record. status: active. age: 34. Only active customers may log in."
YES_NO = {"recompute": ("no", 40), "erratum": ("no", 24), "stale": ("yes", 0)}


def finished_sweep(server, decided: dict[str, tuple[str, str | None, int]] | None = None,
                   question: str = "Can this customer log in?", choices: tuple[str, ...] = ("yes", "no"),
                   ) -> tuple[int, int]:
    """A notebook with a status field and a finished 3-edit sweep (banned, closed, gone) of
    recompute and erratum, its edits' results written as a worker writes them: (notebook, sweep).
    `decided`: per strategy, (decision, edit_followed, tokens computed); by default a yes/no
    question on which erratum follows recompute at 24 of 40 tokens."""
    from sqlalchemy import select

    from data.models import Run, RunResult, Sweep
    from tests.conftest import api_call, api_notebook

    decided = decided or {k: (d, None, t) for k, (d, t) in YES_NO.items()}
    nb = api_notebook(f"{server.url}/api", SWEEP_DOC, "policy", ("active", "banned", "status"))
    sweep = api_call(f"{server.url}/api/notebooks/{nb}/sweeps", "POST",
                     {"question": question, "choices": list(choices), "strategies": ["recompute", "erratum"],
                      "values": {"status": ["banned", "closed", "gone"]}})
    with server.db() as s:
        for run in s.scalars(select(Run).where(Run.sweep_id == sweep["id"])):
            run.status, run.stage, run.progress = "succeeded", "done", 1.0
            for name, (decision, followed, tokens) in decided.items():
                s.add(RunResult(run_id=run.id, strategy=name, decision=decision, choice_probs={decision: 0.8},
                                kl_to_recompute=0.0, top1_agrees=True, topk_overlap=10, logit_cosine=1.0,
                                decision_matches_recompute=decision == decided["recompute"][0],
                                tokens_computed=tokens, latency_ms=10.0, ttft_ms=9.0, decode_ms=1.0,
                                answer_f1=1.0, prefix_cache_share=0.5, text="", detail="", tokens=[],
                                edit_followed=followed))
        row = s.get(Sweep, sweep["id"])
        row.status, row.edits_done = "succeeded", 3
        s.commit()
    return nb, sweep["id"]
