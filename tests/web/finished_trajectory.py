"""A finished 4-turn trajectory written straight into the database (no worker), as the worker
writes one: turn 2 changes status to "suspended", turn 4 sets it back; recompute answers yes, no,
no, yes; stale keeps "yes"; erratum misses turn 3. Used by the trajectory page and browser tests."""

from __future__ import annotations

from vocabulary.trajectories import FieldSpec, StrategyTurn, TrajectorySpec, TurnRecord, TurnSpec

DOC = "Customer record. status: active. Only active customers may log in."
AT = DOC.index("active")
DECISIONS = {  # per turn: recompute, stale, erratum
    "recompute": ["yes", "no", "no", "yes"], "stale": ["yes", "yes", "yes", "yes"],
    "erratum": ["yes", "no", "yes", "yes"]}


def _record(i: int, changed: list[str]) -> TurnRecord:
    results = {}
    for key, decisions in DECISIONS.items():
        agrees = decisions[i] == DECISIONS["recompute"][i]
        followed = None if i in (0, 3) else ("new" if decisions[i] == "no" else "old")
        results[key] = StrategyTurn(
            decision=decisions[i], agrees=agrees, edit_followed=followed,
            kl_to_recompute=0.0 if agrees else 1.2, logit_cosine=0.99, tokens_computed=40,
            ttft_ms=10_000.0 + i, cumulative_ttft_ms=10_000.0 * (i + 1), cache_tokens=40 + i,
            cumulative_tokens=40 * (i + 1), errata=0)
    return TurnRecord(index=i, prompt_tokens=40 + i, changed=changed, results=results)


def finished_trajectory(session=None, append: str = "a") -> int:
    """A finished 4-turn trajectory (written as the worker writes one), in `session` (else this
    process's database): its id. `append`: what the first turn appends (a tool's output, say)."""
    from data.db import get_sessionmaker
    from data.trajectories import Trajectory

    turns = (TurnSpec(append=append), TurnSpec(fields={"status": "suspended"}), TurnSpec(append="b"),
             TurnSpec(fields={"status": "active"}))
    spec = TrajectorySpec(model="smollm2-135m", document=DOC, fields=(FieldSpec("status", AT, AT + 6),),
                          turns=turns, question="Can this customer log in?", choices=("yes", "no"),
                          strategies=tuple(DECISIONS))
    records = [_record(0, []), _record(1, ["status"]), _record(2, []), _record(3, ["status"])]
    with session or get_sessionmaker()() as s:
        row = Trajectory(model="smollm2-135m", spec=spec, status="succeeded", stage="done", progress=1.0,
                         turns_total=4, turns_done=4, turns=records)
        s.add(row)
        s.commit()
        return row.id
