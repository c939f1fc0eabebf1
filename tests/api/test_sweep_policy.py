"""A finished sweep's policy adopted by its notebook (issue 23 item 4): refused while the sweep is
queued; adopted at a threshold given on the request, it is on the notebook (API and page, with a
link to its sweep); a later run that includes auto carries it in its snapshot (one without auto does
not); dropped, runs carry none again. The sweep is finished by writing its edits' results straight
into the database (no worker): 3 changed edits on which erratum follows recompute at 24 of 40 tokens."""

from __future__ import annotations

from sqlalchemy import select

from tests.api.conftest import DOC, _notebook

QUESTION = {"question": "Can this customer log in?", "choices": ["yes", "no"]}


def _finish(sweep_id: int) -> None:
    """Each edit's run succeeded: recompute and erratum decide "no", stale keeps "yes"."""
    from data.db import get_sessionmaker
    from data.models import Run, RunResult, Sweep

    decided = {"recompute": ("no", 40), "erratum": ("no", 24), "stale": ("yes", 0)}
    with get_sessionmaker()() as s:
        for run in s.scalars(select(Run).where(Run.sweep_id == sweep_id)):
            run.status, run.stage, run.progress = "succeeded", "done", 1.0
            for name, (decision, tokens) in decided.items():
                s.add(RunResult(run_id=run.id, strategy=name, decision=decision,
                                choice_probs={decision: 0.8}, kl_to_recompute=0.0, top1_agrees=True,
                                topk_overlap=10, logit_cosine=1.0,
                                decision_matches_recompute=decision == "no", tokens_computed=tokens,
                                latency_ms=10.0, ttft_ms=9.0, decode_ms=1.0, answer_f1=1.0,
                                prefix_cache_share=0.5, text="", detail="", tokens=[]))
        sweep = s.get(Sweep, sweep_id)
        sweep.status, sweep.edits_done = "succeeded", 3
        s.commit()


def test_adopt_a_sweeps_policy_then_runs_with_auto_carry_it_until_it_is_dropped(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    start = DOC.index("active")
    assert client.post(f"/api/notebooks/{nb}/fields", json={"start": start, "end": start + 6,
                                                            "new_value": "banned", "label": "status"}
                       ).status_code == 201
    values = {"status": ["banned", "closed", "gone"]}
    r = client.post(f"/api/notebooks/{nb}/sweeps",
                    json={**QUESTION, "strategies": ["recompute", "erratum"], "values": values})
    assert r.status_code == 201, r.text
    sweep = r.json()["id"]
    queued = client.post(f"/api/sweeps/{sweep}/adopt")
    assert queued.status_code == 422 and "once it has finished" in queued.text
    assert "Adopt this policy" not in client.get(f"/sweeps/{sweep}").text

    _finish(sweep)
    view = client.get(f"/api/sweeps/{sweep}?threshold=0.2").json()
    changed = view["strategies"]["erratum"]["changed"]  # 3 of 3 changed edits: lower bound 0.23
    assert (changed["agreed"], changed["edits"]) == (3, 3) and 0.23 < changed["ci95"][0] < 0.24
    assert view["policy"]["strategy"] == "erratum"
    assert client.get(f"/api/sweeps/{sweep}").json()["policy"]["strategy"] == "recompute"  # at 0.95
    assert "Adopt this policy" in client.get(f"/sweeps/{sweep}?threshold=0.2").text
    assert client.post(f"/api/sweeps/{sweep}/adopt?threshold=1.5").status_code == 422

    adopted = client.post(f"/api/sweeps/{sweep}/adopt?threshold=0.2")
    assert adopted.status_code == 200, adopted.text
    notebook = client.get(f"/api/notebooks/{nb}").json()
    assert (notebook["policy_strategy"], notebook["policy_sweep_id"], notebook["policy_threshold"]) == \
        ("erratum", sweep, 0.2)
    assert notebook["policy_sentence"] == view["policy"]["sentence"] == (
        "Erratum agreed with recompute on 3 of 3 determined edits (lower bound 0.23) and 3 of 3 changed "
        "edits (lower bound 0.23), both >= 0.20, at 60% of recompute's tokens")
    page = client.get(f"/notebooks/{nb}").text
    assert f'href="/sweeps/{sweep}"' in page and "Drop this policy" in page and "<code>erratum</code>" in page

    def snapshot_policy(strategies: list[str]):
        run = client.post(f"/api/notebooks/{nb}/runs", json={**QUESTION, "strategies": strategies})
        assert run.status_code == 201, run.text
        return client.get(f"/api/runs/{run.json()['id']}").json()["snapshot"]["policy"]

    assert snapshot_policy(["auto"]) == "erratum"
    assert snapshot_policy(["erratum"]) is None

    dropped = client.delete(f"/api/notebooks/{nb}/policy")
    assert dropped.status_code == 200 and dropped.json()["policy_strategy"] is None
    assert "Drop this policy" not in client.get(f"/notebooks/{nb}").text
    assert snapshot_policy(["auto"]) is None

    # the same through the pages: the sweep page's form adopts, the notebook page's drops
    form = client.post(f"/sweeps/{sweep}/adopt", data={"threshold": "0.2"}, follow_redirects=False)
    assert form.status_code == 303 and form.headers["location"] == f"/notebooks/{nb}#adopted-policy"
    assert client.get(f"/api/notebooks/{nb}").json()["policy_strategy"] == "erratum"
    htmx = client.post(f"/notebooks/{nb}/policy/drop", headers={"HX-Request": "true"})
    assert htmx.status_code == 204 and htmx.headers["HX-Redirect"] == f"/notebooks/{nb}"
    assert client.get(f"/api/notebooks/{nb}").json()["policy_strategy"] is None
    bad = client.post(f"/sweeps/{sweep}/adopt", data={"threshold": "lots"})
    assert bad.status_code == 422 and "threshold must be a number" in bad.text
