"""Sweeps that decide (issue 31), through the API and the panel on the embedded broker (no worker):
values outside the choices refused naming their row, or the choices extended on request (the page
says so); values generated (integers, timestamps, dates, lines) and their bad input (an empty or
reversed range, more values than KVNOTES_MAX_SWEEP_EDITS, a threshold outside (0, 1)) refused with
nothing saved; every strategy that runs alone compared by default; and a sweep that stops when
decided, its edits' results written straight into the database: it stops at the first finished edit
after which no edit can change the policy, cancels the rest and says so, with `needed` per strategy."""

from __future__ import annotations

import pytest

from tests.api.conftest import _counts, _notebook

DOC = "Shipment log. destination: Oslo. Carrier: Nordic Freight. Where does the shipment go?"


def _with_field(client) -> int:
    nb = _notebook(client, DOC)["id"]
    start = DOC.index("Oslo")
    r = client.post(f"/api/notebooks/{nb}/fields", json={"start": start, "end": start + 4,
                                                         "new_value": "Madrid", "label": "destination"})
    assert r.status_code == 201, r.text
    return nb


def _body(**extra) -> dict:
    return {"question": "Where does the shipment go?", "choices": ["Oslo", "Madrid"],
            "strategies": ["recompute", "in_place", "erratum"], **extra}


def test_values_outside_the_choices_are_refused_by_row_or_extend_them(make_client) -> None:
    client = make_client(KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER="9")
    nb = _with_field(client)
    before = _counts()
    cities = ["Madrid", "Paris", "Berlin"]
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"destination": cities}))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "values.destination"]
    assert detail["msg"].startswith("value 2 of 'destination': 'Paris' is not among the question's "
                                    "choices (Oslo, Madrid)") and "extend_choices" in detail["msg"]
    rows = client.post(f"/api/notebooks/{nb}/sweeps",
                       json=_body(edits=[{"destination": "Madrid"}, {"destination": "Vienna"}]))
    assert rows.status_code == 422
    assert rows.json()["detail"][0]["msg"].startswith("row 2, column 'destination': 'Vienna' is not among")
    assert _counts() == before
    # yes/no choices name no value of the field: any value is taken
    yes_no = client.post(f"/api/notebooks/{nb}/sweeps",
                         json=_body(choices=["yes", "no"], values={"destination": ["Paris"]}))
    assert yes_no.status_code == 201 and yes_no.json()["extended_choices"] == []
    extended = client.post(f"/api/notebooks/{nb}/sweeps",
                           json=_body(values={"destination": cities}, extend_choices=True))
    assert extended.status_code == 201, extended.text
    view = extended.json()
    assert view["choices"] == ["Oslo", "Madrid", "Paris", "Berlin"]
    assert view["extended_choices"] == ["Paris", "Berlin"]
    run = client.get(f"/api/runs/{view['edits'][1]['run_id']}").json()
    assert run["snapshot"]["question"]["choices"] == ["Oslo", "Madrid", "Paris", "Berlin"]
    page = client.get(f"/sweeps/{view['id']}").text
    assert "Choices extended for this sweep with Paris, Berlin" in page


def test_every_strategy_that_runs_alone_is_compared_by_default(make_client) -> None:
    from vocabulary import EDIT_INFO

    client = make_client()
    nb = _with_field(client)
    r = client.post(f"/api/notebooks/{nb}/sweeps", json={"question": "Where?", "choices": ["Oslo", "Madrid"],
                                                         "values": {"destination": ["Madrid"]}})
    assert r.status_code == 201, r.text
    alone = [name for name, info in EDIT_INFO.items() if info.role != "composite"]
    assert sorted(r.json()["strategies_asked"]) == sorted(alone) and "hoist" in alone
    assert r.json()["stop_when_decided"] is False and r.json()["stopped"] is None


def test_generated_values_and_their_bad_input(make_client) -> None:
    client = make_client(KVNOTES_MAX_SWEEP_EDITS="50", KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER="9")
    nb = _with_field(client)
    before = _counts()
    gen = {"field": "destination", "kind": "integers", "count": 4, "start": "1", "end": "10"}
    cases = [
        ({**gen, "start": "10", "end": "10"}, "generate.destination",
         "the range is empty: start and end are both 10"),
        ({**gen, "start": "10", "end": "1"}, "generate.destination",
         "the range is reversed: start 10 is after end 1"),
        ({**gen, "count": 60}, "generate.destination", "60 values asked; a sweep takes at most 50 edits "
                                                        "(KVNOTES_MAX_SWEEP_EDITS)"),
        ({**gen, "kind": "dates", "start": "2026-02-01", "end": "2026-01-01"}, "generate.destination",
         "the range is reversed: start 2026-02-01 is after end 2026-01-01"),
        ({**gen, "kind": "timestamps", "start": "noon"}, "generate.destination",
         "start 'noon' is not an ISO 8601 date-time"),
        ({**gen, "kind": "lines", "lines": ["a", "b"]}, "generate.destination",
         "4 values asked from 2 distinct"),
        ({**gen, "field": "weight"}, "generate.weight", "'weight' names no field"),
    ]
    for item, where, message in cases:
        r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(choices=[], generate=[item]))
        assert r.status_code == 422, (item, r.text)
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", where] and message in detail["msg"], (item, detail)
    for threshold in (0, 1, 1.5, -0.1):
        r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(choices=[], threshold=threshold,
                                                                   generate=[gen]))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "threshold"], r.text
    assert _counts() == before
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(choices=[], generate=[
        gen, {"field": "destination", "kind": "timestamps", "count": 3, "start": "2026-01-01T00:00",
              "end": "2026-01-01T12:00"}], values={"destination": ["Madrid"]}))
    assert r.status_code == 201, r.text
    assert [e["values"]["destination"] for e in r.json()["edits"]] == [
        "Madrid", "1", "4", "7", "10", "2026-01-01 00:00", "2026-01-01 06:00", "2026-01-01 12:00"]
    sampled = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(choices=[], generate=[
        {"field": "destination", "kind": "lines", "count": 3, "seed": 7,
         "lines": ["Bergen", "Lyon", "Porto", "Graz", "Turku"]}]))
    again = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(choices=[], generate=[
        {"field": "destination", "kind": "lines", "count": 3, "seed": 7,
         "lines": ["Bergen", "Lyon", "Porto", "Graz", "Turku"]}]))
    picked = [[e["values"]["destination"] for e in x.json()["edits"]] for x in (sampled, again)]
    assert picked[0] == picked[1] and len(set(picked[0])) == 3  # the seed gives the same sample


def test_the_panel_generates_values_extends_choices_and_stops_when_decided(make_client) -> None:
    client = make_client(KVNOTES_MAX_SWEEP_EDITS="50", KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER="9")
    nb = _with_field(client)
    panel = client.get(f"/notebooks/{nb}/sweep").text
    assert 'name="stop_when_decided" value="1" checked' in panel  # on by default from the page
    assert 'name="gen_kind_0"' in panel and 'name="extend_choices"' in panel
    form = {"question": "Where does the shipment go?", "choices": "Oslo, Madrid", "threshold": "0.9",
            "strategies": ["in_place", "hoist"], "stop_when_decided": "1"}
    before = _counts()
    bad = client.post(f"/notebooks/{nb}/sweeps", data={**form, "gen_kind_0": "integers", "gen_count_0": "5",
                                                       "gen_start_0": "9", "gen_end_0": "1"})
    assert bad.status_code == 422 and "the range is reversed: start 9 is after end 1" in bad.text
    outside = client.post(f"/notebooks/{nb}/sweeps", data={**form, "values_0": "Madrid\nParis"})
    assert outside.status_code == 422
    assert "&#39;Paris&#39; is not among the question&#39;s choices" in outside.text
    assert _counts() == before
    lines = b"Bergen\nLyon\nPorto\nGraz\n"
    ok = client.post(f"/notebooks/{nb}/sweeps", data={**form, "gen_kind_0": "lines", "gen_count_0": "3",
                                                      "gen_seed_0": "1", "extend_choices": "1"},
                     files={"gen_lines_0": ("cities.txt", lines, "text/plain")})
    assert ok.status_code == 204, ok.text
    sweep = client.get("/api" + ok.headers["HX-Redirect"]).json()
    assert sweep["edits_total"] == 3 and sweep["stop_when_decided"] is True
    assert len(sweep["extended_choices"]) == 3 and sweep["threshold"] == 0.9
    page = client.get(ok.headers["HX-Redirect"]).text
    assert "0 of 3 edits" in page and "no edit has finished yet" in page and "Policy at threshold 0.90:" \
        not in page.split("no edit has finished yet")[0].split('id="policy"')[1]


def _finish(run_ids: list[int], decided: dict[str, tuple[str, int]]) -> None:
    """These edits succeeded as a worker would leave them: each strategy's decision (a free answer
    naming the new value, Madrid, or the old one, Oslo) and tokens."""
    from data.db import get_sessionmaker
    from data.models import Run, RunResult

    with get_sessionmaker()() as s:
        for run_id in run_ids:
            run = s.get(Run, run_id)
            run.status, run.stage, run.progress = "succeeded", "done", 1.0
            for name, (decision, tokens) in decided.items():
                s.add(RunResult(run_id=run_id, strategy=name, decision=decision, choice_probs={},
                                edit_followed="new" if decision == "Madrid" else "old",
                                kl_to_recompute=0.0, top1_agrees=True, topk_overlap=10, logit_cosine=1.0,
                                decision_matches_recompute=True, tokens_computed=tokens, latency_ms=10.0,
                                ttft_ms=9.0, decode_ms=1.0, answer_f1=1.0, prefix_cache_share=0.5, text="",
                                detail="", tokens=[]))
        s.commit()


def _refresh(sweep_id: int) -> None:
    from data.db import get_sessionmaker
    from data.sweep_edits import refresh_sweep

    with get_sessionmaker()() as s:
        refresh_sweep(s, sweep_id)


def test_a_sweep_that_stops_when_decided_cancels_the_rest_and_says_so(make_client) -> None:
    """30 edits at threshold 0.5, every edit moving recompute to Madrid: hoist follows it on every
    edit, in_place never does. After 8 edits hoist's lower bounds (8 of 8: 0.58) clear 0.5 and
    in_place (0 of 8, upper bound 0.42) and stale are proven below: decided, 22 edits cancelled.
    After 6 it is not yet (hoist 6 of 6: 0.47)."""
    client = make_client(KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER="9")
    nb = _with_field(client)
    values = [f"Port {i}" for i in range(30)]
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(
        choices=[], strategies=["recompute", "in_place", "hoist"], values={"destination": values},
        threshold=0.5, stop_when_decided=True))
    assert r.status_code == 201, r.text
    sweep = r.json()
    runs = [e["run_id"] for e in sweep["edits"]]
    outcome = {"recompute": ("Madrid", 100), "stale": ("Oslo", 0), "in_place": ("Oslo", 1),
               "hoist": ("Madrid", 3)}
    _finish(runs[:6], outcome)
    _refresh(sweep["id"])
    view = client.get(f"/api/sweeps/{sweep['id']}").json()
    assert (view["status"], view["stopped"], view["edits_done"]) == ("running", None, 6)
    assert view["policy"]["strategy"] == "recompute" and not view["policy"]["decided"]
    assert view["strategies"]["hoist"]["needed"] == 2 and view["strategies"]["stale"]["needed"] is None
    page = client.get(f"/sweeps/{sweep['id']}").text
    assert "hoist would need at least 2 more changed edits, all agreeing, to reach 0.50" in page
    assert "After 6 of 30 edits" in page
    _finish(runs[6:8], outcome)
    _refresh(sweep["id"])
    view = client.get(f"/api/sweeps/{sweep['id']}").json()
    assert (view["status"], view["stopped"], view["edits_done"]) == ("succeeded", "decided", 8)
    assert view["policy"]["strategy"] == "hoist" and view["policy"]["decided"]
    assert view["strategies"]["hoist"]["needed"] == 0 and view["strategies"]["in_place"]["proven_below"]
    assert [e["status"] for e in view["edits"]] == ["succeeded"] * 8 + ["cancelled"] * 22
    page = client.get(f"/sweeps/{sweep['id']}").text
    assert "Stopped after 8 of 30 edits: the policy was decided" in page
    # a cancelled sweep says so too
    other = client.post(f"/api/notebooks/{nb}/sweeps",
                        json=_body(choices=[], values={"destination": values[:3]},
                                   stop_when_decided=True)).json()
    assert client.post(f"/api/sweeps/{other['id']}/cancel").json()["stopped"] == "cancelled"


@pytest.mark.slow
def test_a_sweep_on_a_real_worker_stops_as_soon_as_its_policy_is_decided(make_client,
                                                                         engines_without_store) -> None:
    """End to end on the tiny llama, each edit run by the real `kvnotes.run` task in this process:
    with prefix_reuse (exact: it qualifies from its first edit) and stale (the floor, below by
    construction) as the only candidates, the policy is decided after the first edit; the sweep stops
    there (`stopped` "decided", 1 of 4 edits done), its 3 other edits are cancelled, and their
    messages, delivered after all, are dropped without running."""
    from data.db import get_sessionmaker
    from data.models import Run
    from worker.tasks import run as run_task

    client = make_client(KVNOTES_MODELS="smollm2-135m,tiny-llama")
    text = "Account record. status: active. Only active accounts may log in."
    nb = client.post("/api/notebooks",
                     json={"title": "decide", "model": "tiny-llama", "text": text}).json()["id"]
    start = text.index("active")
    assert client.post(f"/api/notebooks/{nb}/fields", json={"start": start, "end": start + 6,
                                                            "new_value": "banned", "label": "status"}
                       ).status_code == 201
    r = client.post(f"/api/notebooks/{nb}/sweeps", json={
        "question": "Can this account log in?", "choices": ["yes", "no"], "threshold": 0.9,
        "strategies": ["recompute", "prefix_reuse"], "stop_when_decided": True,
        "values": {"status": ["banned", "closed", "frozen", "locked"]}})
    assert r.status_code == 201, r.text
    sweep = r.json()
    with get_sessionmaker()() as s:
        tokens = [(e["run_id"], s.get(Run, e["run_id"]).task_id) for e in sweep["edits"]]
    outcomes = [run_task.apply(args=(run_id,), task_id=token).get()["status"] for run_id, token in tokens]
    assert outcomes == ["succeeded", "skipped", "skipped", "skipped"]
    view = client.get(f"/api/sweeps/{sweep['id']}").json()
    assert (view["status"], view["stopped"], view["edits_done"], view["edits_total"]) == \
        ("succeeded", "decided", 1, 4)
    assert view["policy"]["strategy"] == "prefix_reuse" and view["policy"]["decided"]
    assert [e["status"] for e in view["edits"]] == ["succeeded", "cancelled", "cancelled", "cancelled"]
    assert view["strategies"]["prefix_reuse"]["needed"] == 0
    page = client.get(f"/sweeps/{sweep['id']}").text
    assert "Stopped after 1 of 4 edits: the policy was decided" in page
