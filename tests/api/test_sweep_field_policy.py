"""A per-field policy adopted from a sweep that edited two fields separately (issue 23): each field
keeps its own strategy, threshold and sentence on the notebook (API and page); a later run's `auto`
runs the strategy of the field it edits, the most conservative of them when it edits several, and
the overall policy for a field the sweep did not vary, each stated in the run's snapshot and on its
page; dropped, the per-field policies go too. The sweep is finished by writing its edits' results
straight into the database (no worker): on the 3 status edits erratum decides as recompute does, on
the 3 tier edits it keeps the old answer, so at threshold 0.07 status gets erratum (3 of 3 on both
bounds: lower bound 0.23), tier gets prefix_reuse (exact, 38 of 40 tokens) and the whole sweep
erratum (3 of 6 on both: lower bound 0.077, the 95% confidence sequence)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.api.conftest import _notebook

DOC = "Customer record. status: active. tier: gold. region: north. Only active customers may log in."
QUESTION = {"question": "Can this customer log in?", "choices": ["yes", "no"]}
FIELDS = {"status": "active", "tier": "gold", "region": "north"}


def _finish(sweep_id: int) -> None:
    """Every edit succeeded: recompute and prefix_reuse decide "no" and stale keeps "yes"; erratum
    decides "no" on the status edits and "yes" on the tier edits."""
    from data.db import get_sessionmaker
    from data.models import Run, RunResult, Sweep

    with get_sessionmaker()() as s:
        for run in s.scalars(select(Run).where(Run.sweep_id == sweep_id)):
            erratum = "no" if run.sweep_edit.group == "status" else "yes"
            decided = {"recompute": ("no", 40), "prefix_reuse": ("no", 38), "erratum": (erratum, 24),
                       "stale": ("yes", 0)}
            run.status, run.stage, run.progress = "succeeded", "done", 1.0
            for name, (decision, tokens) in decided.items():
                s.add(RunResult(run_id=run.id, strategy=name, decision=decision,
                                choice_probs={decision: 0.8}, kl_to_recompute=0.0, top1_agrees=True,
                                topk_overlap=10, logit_cosine=1.0,
                                decision_matches_recompute=decision == "no", tokens_computed=tokens,
                                latency_ms=10.0, ttft_ms=9.0, decode_ms=1.0, answer_f1=1.0,
                                prefix_cache_share=0.5, text="", detail="", tokens=[]))
        sweep = s.get(Sweep, sweep_id)
        sweep.status, sweep.edits_done = "succeeded", sweep.edits_total
        s.commit()


def _sweep(client, nb: int, values: dict[str, list[str]]) -> int:
    r = client.post(f"/api/notebooks/{nb}/sweeps",
                    json={**QUESTION, "strategies": ["recompute", "prefix_reuse", "erratum"],
                          "values": values})
    assert r.status_code == 201, r.text
    _finish(r.json()["id"])
    return r.json()["id"]


def test_a_per_field_policy_applies_the_edited_fields_strategy_until_dropped(make_client) -> None:
    client = make_client()
    nb = _notebook(client, DOC)["id"]
    field_ids = {}
    for label, old in FIELDS.items():
        start = DOC.index(old)
        r = client.post(f"/api/notebooks/{nb}/fields",
                        json={"start": start, "end": start + len(old), "new_value": old, "label": label})
        assert r.status_code == 201, r.text
        field_ids[label] = r.json()["id"]
    sweep = _sweep(client, nb, {"status": ["banned", "closed", "gone"], "tier": ["silver", "bronze", "iron"]})
    view = client.get(f"/api/sweeps/{sweep}?threshold=0.07").json()
    assert view["edits_total"] == 6
    assert (view["policy"]["strategy"], view["policy"]["cost_share"]) == ("erratum", 0.6)
    assert view["strategies"]["erratum"]["changed"]["agreed"] == 3
    assert view["strategies"]["erratum"]["changed"]["ci95"][0] == pytest.approx(0.0769, abs=1e-4)
    per_field = {p["field"]: p for p in view["policy"]["per_field"]}
    assert {k: (p["strategy"], p["cost_share"]) for k, p in per_field.items()} == \
        {"status": ("erratum", 0.6), "tier": ("prefix_reuse", 0.95)}
    assert "Adopt the per-field policy" in client.get(f"/sweeps/{sweep}?threshold=0.07").text

    adopted = client.post(f"/api/sweeps/{sweep}/adopt?threshold=0.07&per_field=true")
    assert adopted.status_code == 200, adopted.text
    notebook = client.get(f"/api/notebooks/{nb}").json()
    assert (notebook["policy_strategy"], notebook["policy_sweep_id"], notebook["policy_threshold"]) == \
        ("erratum", sweep, 0.07)
    assert notebook["policy_fields"] == [
        {"field": "status", "strategy": "erratum", "threshold": 0.07, "cost_share": 0.6,
         "sentence": "Erratum agreed with recompute on 3 of 3 determined edits (lower bound 0.23) and 3 "
                     "of 3 changed edits (lower bound 0.23), both >= 0.07, at 60% of recompute's tokens"},
        {"field": "tier", "strategy": "prefix_reuse", "threshold": 0.07, "cost_share": 0.95,
         "sentence": "erratum agreed with recompute on 0 of 3 determined edits (lower bound 0.00) and 0 "
                     "of 3 changed edits (lower bound 0.00): held back by both bounds, below 0.07, so "
                     "prefix_reuse is exact (it agreed on all 3 determined edits), at 95% of "
                     "recompute's tokens"},
    ]
    page = client.get(f"/notebooks/{nb}").text
    assert 'data-field-policy="status"' in page and 'data-field-policy="tier"' in page
    assert "the most conservative of theirs" in page

    runs: list[int] = []

    def auto_run(**edited: str) -> tuple[str | None, str | None]:
        """Set the fields' new values (the others back to their old ones), run auto: what its
        snapshot says auto runs, and why."""
        for label, old in FIELDS.items():
            r = client.patch(f"/api/fields/{field_ids[label]}", json={"new_value": edited.get(label, old)})
            assert r.status_code == 200, r.text
        run = client.post(f"/api/notebooks/{nb}/runs", json={**QUESTION, "strategies": ["auto"]})
        assert run.status_code == 201, run.text
        snapshot = client.get(f"/api/runs/{run.json()['id']}").json()["snapshot"]
        runs.append(run.json()["id"])
        return snapshot["policy"], snapshot["policy_note"]

    assert auto_run(status="banned") == ("erratum", "the run edits status (erratum)")
    assert auto_run(tier="silver") == ("prefix_reuse", "the run edits tier (prefix_reuse)")
    assert auto_run(status="banned", tier="silver") == (
        "prefix_reuse", "the run edits status (erratum) and tier (prefix_reuse): the most conservative, "
                        "prefix_reuse")
    both = runs[-1]
    assert auto_run(region="south") == \
        ("erratum", "the run edits region (no policy of its own: the overall erratum)")
    assert auto_run(region="south", tier="silver")[0] == "prefix_reuse"
    assert auto_run() == ("erratum", "the run edits no field: the sweep's overall policy, erratum")

    # the run page's legend states why auto ran what it ran
    from data.db import get_sessionmaker
    from data.models import RunResult

    with get_sessionmaker()() as s:
        s.add(RunResult(run_id=both, strategy="auto", decision="no", picked="prefix_reuse",
                        tokens_computed=38, tokens=[]))
        s.commit()
    run_page = client.get(f"/runs/{both}").text
    assert "the most conservative, prefix_reuse" in run_page
    assert "it ran only <code>prefix_reuse</code>" in run_page

    dropped = client.delete(f"/api/notebooks/{nb}/policy")
    assert dropped.status_code == 200
    assert (dropped.json()["policy_strategy"], dropped.json()["policy_fields"]) == (None, None)
    assert 'data-field-policy="status"' not in client.get(f"/notebooks/{nb}").text
    assert auto_run(status="banned") == (None, None)

    # the sweep page's per-field form adopts the same; adopting the overall policy forgets them
    form = client.post(f"/sweeps/{sweep}/adopt", data={"threshold": "0.07", "per_field": "1"},
                       follow_redirects=False)
    assert form.status_code == 303
    assert [p["strategy"] for p in client.get(f"/api/notebooks/{nb}").json()["policy_fields"]] == \
        ["erratum", "prefix_reuse"]
    assert client.post(f"/api/sweeps/{sweep}/adopt?threshold=0.07").status_code == 200
    assert client.get(f"/api/notebooks/{nb}").json()["policy_fields"] is None
    assert auto_run(tier="silver") == ("erratum", None)

    # a sweep of one field has no per-field policy to adopt
    single = _sweep(client, nb, {"status": ["banned", "closed"]})
    refused = client.post(f"/api/sweeps/{single}/adopt?per_field=true")
    assert refused.status_code == 422 and "has no per-field policy" in refused.text
    assert client.get(f"/api/notebooks/{nb}").json()["policy_sweep_id"] == sweep  # nothing changed
