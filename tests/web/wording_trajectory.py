"""A finished 4-turn free-answer trajectory whose answers differ only in wording, written as the
worker wrote one before the one agreement rule (issue 43): `agrees` compared the words, so hoist's
"The account status is suspended." was stored as disagreeing with recompute's "The account is
suspended."; stale names the old value on turns 2 and 3 and matches recompute on turn 4 (the
status set back). Turn 2 changes the status, turn 4 sets it back."""

from __future__ import annotations

from vocabulary.trajectories import FieldSpec, StrategyTurn, TrajectorySpec, TurnRecord, TurnSpec

DOC = ("Account record\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n"
       "Only accounts whose status is active may log in.\n")
AT = DOC.index("active")
ANSWERS = {  # per turn
    "recompute": ["The account is active.", "The account is suspended.", "The account is suspended.",
                  "The account is active."],
    "stale": ["Active.", "The account is active.", "The account is active.",
              "The account is currently active."],
    "hoist": ["The account status is active.", "The account status is suspended.",
              "The account status is suspended.", "The account status is active."],
}
FOLLOWED = {"recompute": [None, "new", "new", None], "stale": [None, "old", "old", None],
            "hoist": [None, "new", "new", None]}


def _record(i: int, changed: list[str]) -> TurnRecord:
    results = {}
    for key, answers in ANSWERS.items():
        agrees = answers[i] == ANSWERS["recompute"][i]  # the old rule: the same words
        results[key] = StrategyTurn(
            decision=answers[i], agrees=agrees, edit_followed=FOLLOWED[key][i],
            kl_to_recompute=0.01 if agrees else 0.3, logit_cosine=0.99, tokens_computed=40,
            ttft_ms=1000.0 + i, cumulative_ttft_ms=1000.0 * (i + 1), cache_tokens=40 + i,
            cumulative_tokens=40 * (i + 1), errata=0)
    return TurnRecord(index=i, prompt_tokens=206 + i, changed=changed, results=results)


def wording_trajectory(session) -> int:
    """The trajectory, in `session`: its id."""
    from data.trajectories import Trajectory

    turns = (TurnSpec(append="\n[tool] lookup: 2 tickets open."), TurnSpec(fields={"status": "suspended"}),
             TurnSpec(append="\n[tool] billing: unpaid."), TurnSpec(fields={"status": "active"}))
    spec = TrajectorySpec(model="smollm2-135m", document=DOC, fields=(FieldSpec("status", AT, AT + 6),),
                          turns=turns, question="What is the account's status?", choices=(),
                          strategies=tuple(ANSWERS))
    records = [_record(0, []), _record(1, ["status"]), _record(2, []), _record(3, ["status"])]
    row = Trajectory(model="smollm2-135m", spec=spec, status="succeeded", stage="done", progress=1.0,
                     turns_total=4, turns_done=4, turns=records)
    session.add(row)
    session.commit()
    return row.id
