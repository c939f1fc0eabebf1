"""Sweeps through the API on the embedded broker (no worker): a sweep of N values leaves N messages
on the model's queue, each the run of one edit; an edit equal to the old value is skipped and
counted; bad input is a 422 naming its row and column with nothing saved (an empty value list, a
column naming no field, an empty value, more edits than KVNOTES_MAX_SWEEP_EDITS, a model no worker
serves); an unreachable broker is a 503 with nothing saved; the sweep cap refuses a second sweep
while the run cap never refuses a sweep's 12 edits; cancelling keeps the finished edits."""

from __future__ import annotations

from pathlib import Path

from app.services.sweep_input import rows_from_upload
from tests.api.conftest import DOC, _broker_messages, _counts, _notebook


def _with_field(client, text: str = DOC) -> int:
    nb = _notebook(client, text)["id"]
    start = text.index("active")
    r = client.post(f"/api/notebooks/{nb}/fields",
                    json={"start": start, "end": start + 6, "new_value": "banned", "label": "status"})
    assert r.status_code == 201, r.text
    return nb


def _body(**extra) -> dict:
    return {"question": "Can this customer log in?", "choices": ["yes", "no"],
            "strategies": ["recompute", "erratum"], **extra}


def test_a_sweep_queues_one_run_per_edit_and_skips_the_old_value(make_client, tmp_path: Path) -> None:
    client = make_client()
    nb = _with_field(client)
    values = ["banned", "suspended", "active", "closed"]  # "active" is the old value
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": values}, timed_edits=2))
    assert r.status_code == 201, r.text
    sweep = r.json()
    assert (sweep["status"], sweep["edits_total"], sweep["edits_done"], sweep["edits_skipped"]) == \
        ("queued", 3, 0, 1)
    assert sweep["strategies_asked"] == ["recompute", "erratum", "stale"]  # stale: the original decision
    assert [e["values"] for e in sweep["edits"]] == [{"status": "banned"}, {"status": "suspended"},
                                                     {"status": "closed"}]
    messages = _broker_messages(tmp_path)
    assert sorted(m["run_id"] for _, m in messages) == sorted(e["run_id"] for e in sweep["edits"])
    assert {q for q, _ in messages} == {"model.smollm2-135m"}
    run = client.get(f"/api/runs/{sweep['edits'][1]['run_id']}").json()  # an ordinary run
    assert [(f["label"], f["old"], f["new"]) for f in run["snapshot"]["fields"]] == \
        [("status", "active", "suspended")]
    assert run["snapshot"]["sweep_id"] == sweep["id"]
    # timed_edits 2: the worker times the first 2 edits in paired rounds, the third decides only
    assert [client.get(f"/api/runs/{e['run_id']}").json()["snapshot"]["timed"] for e in sweep["edits"]] == \
        [True, True, False]
    assert sweep["edits_timed"] == 0 and sweep["exact_reference_kl"] is None  # nothing finished yet
    assert client.get(f"/api/notebooks/{nb}/sweeps").json() == [sweep["id"]]
    page = client.get(f"/sweeps/{sweep['id']}")
    assert page.status_code == 200 and "0 of 3 edits" in page.text and "<svg" in page.text
    lines = client.get(f"/sweeps/{sweep['id']}/export.csv").text.splitlines()
    assert lines[0].startswith("sweep_id,position,run_id,status") and len(lines) == 1 + 3 * 3
    report = client.get(f"/sweeps/{sweep['id']}/report.html")
    assert report.status_code == 200 and "<script" not in report.text and "<svg" in report.text
    assert "content-disposition" not in report.headers  # it opens, as the other reports do (issue 51)
    saved = client.get(f"/sweeps/{sweep['id']}/report.html?download=1").headers["content-disposition"]
    assert saved.startswith("attachment;")
    # cancelled before any edit ran: nothing finished to keep, all 3 cancelled
    done = client.post(f"/api/sweeps/{sweep['id']}/cancel").json()
    assert done["status"] == "cancelled" and done["edits_done"] == 0
    assert {e["status"] for e in done["edits"]} == {"cancelled"}
    assert client.post(f"/api/sweeps/{sweep['id']}/cancel").status_code == 409


def test_bad_input_names_row_and_column_and_saves_nothing(make_client) -> None:
    client = make_client(KVNOTES_MAX_SWEEP_EDITS="3")
    nb = _with_field(client)
    before = _counts()
    cases = [
        ({"values": {"status": []}}, "values.status", "the value list of 'status' is empty"),
        ({"values": {"tier": ["gold"]}}, "values.tier", "'tier' names no field of this notebook"),
        ({"values": {"status": ["banned", " "]}}, ("values", "status", 1), "cannot be blank"),  # text rules
        ({"edits": [{"status": "banned"}, {"tier": "gold"}]}, "edits",
         "row 2, column 'tier': names no field"),
        ({"edits": [{"status": "banned"}, {"status": ""}]}, "edits",
         "row 2, column 'status': the value is empty"),
        ({"values": {"status": ["a", "b", "c", "d"]}}, "values", "4 edits; a sweep takes at most 3"),
        ({"values": {"status": ["active"]}}, "values", "every edit (1) equals the field's old value"),
        ({"values": {"status": ["banned"]}, "timed_edits": -1}, "timed_edits", "greater than or equal to 0"),
    ]
    for extra, where, message in cases:
        r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(**extra))
        assert r.status_code == 422, (extra, r.text)
        detail = r.json()["detail"][0]
        loc = ["body", *where] if isinstance(where, tuple) else ["body", where]
        assert detail["loc"] == loc and message in detail["msg"], (extra, detail)
    assert client.post(f"/api/notebooks/{nb}/sweeps", json=_body()).status_code == 422  # neither way
    assert _counts() == before


def test_a_model_no_worker_serves_is_refused(make_client) -> None:
    client = make_client()
    nb = _with_field(client)
    from data.db import get_sessionmaker
    from data.models import Notebook

    with get_sessionmaker()() as s:
        s.get(Notebook, nb).model = "no-such-model"
        s.commit()
    before = _counts()
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": ["banned"]}))
    assert r.status_code == 422 and "model 'no-such-model' is not served here" in r.text
    assert _counts() == before


def test_unreachable_broker_saves_nothing(make_client) -> None:
    client = make_client(broker_url="redis://127.0.0.1:1/0")
    nb = _with_field(client)
    before = _counts()
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": ["banned", "closed"]}))
    assert r.status_code == 503
    assert _counts() == before


def test_the_sweep_cap_is_its_own_and_the_run_cap_never_refuses_a_sweep(make_client) -> None:
    client = make_client(KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER="1", KVNOTES_MAX_ACTIVE_RUNS_PER_USER="2")
    nb = _with_field(client)
    values = [f"state{i}" for i in range(12)]
    r = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": values}))
    assert r.status_code == 201 and r.json()["edits_total"] == 12  # 12 edits past a run cap of 2
    again = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": ["x"]}))
    assert again.status_code == 429 and "KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER" in again.text
    run = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Can they log in?",
                                                          "strategies": ["recompute"]})
    assert run.status_code == 201  # the sweep's 12 queued edits do not count against the run cap


def test_uploads_read_csv_and_jsonl() -> None:
    assert rows_from_upload("status,expected\nbanned,no\nclosed,\n") == [
        {"status": "banned", "expected": "no"}, {"status": "closed", "expected": ""}]
    assert rows_from_upload('{"status": "banned"}\n\n{"status": "closed", "expected": "no"}\n',
                            "e.jsonl") == [{"status": "banned"}, {"status": "closed", "expected": "no"}]


def test_the_notebook_panel_starts_a_sweep_or_says_what_is_wrong(make_client) -> None:
    client = make_client()
    nb = _with_field(client)
    panel = client.get(f"/notebooks/{nb}/sweep")
    assert panel.status_code == 200 and 'name="values_0"' in panel.text and "status" in panel.text
    form = {"question": "Can this customer log in?", "choices": "yes, no", "strategies": ["erratum"],
            "threshold": "0.9"}
    before = _counts()
    bad = client.post(f"/notebooks/{nb}/sweeps", data=form,
                      files={"upload": ("edits.csv", b"status,tier\nbanned,gold\n", "text/csv")})
    assert bad.status_code == 422 and "row 1, column &#39;tier&#39;: names no field" in bad.text
    assert _counts() == before
    ok = client.post(f"/notebooks/{nb}/sweeps", data={**form, "values_0": "banned\nclosed\n"})
    assert ok.status_code == 204 and ok.headers["HX-Redirect"].startswith("/sweeps/")
    sweep = client.get("/api" + ok.headers["HX-Redirect"]).json()
    assert sweep["edits_total"] == 2 and sweep["threshold"] == 0.9 and sweep["choices"] == ["yes", "no"]
    cancel = client.post(f"/sweeps/{sweep['id']}/cancel", headers={"HX-Request": "true"})
    assert cancel.status_code == 204 and cancel.headers["HX-Refresh"] == "true"
    assert client.get(f"/api/sweeps/{sweep['id']}").json()["status"] == "cancelled"
    progress = client.get(f"/sweeps/{sweep['id']}/progress")  # finished: htmx stops polling
    assert progress.status_code == 286 and "0 of 2 edits" in progress.text


def test_on_redis_a_sweeps_edits_queue_behind_runs(make_client) -> None:
    """Redis pops a queue's priority-0 list first (kombu's priority steps 0, 3, 6, 9): a run sent after
    a 3-edit sweep lies in the list a worker takes first, the sweep's edits in the priority-9 list."""
    import redis

    url = "redis://127.0.0.1:6379/13"
    try:
        r = redis.Redis.from_url(url, socket_connect_timeout=1)
        r.flushdb()
    except redis.ConnectionError as exc:
        from tests.conftest import missing

        missing(f"Redis unreachable: {exc}")
    client = make_client(broker_url=url)
    nb = _with_field(client)
    sweep = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": ["a", "b", "c"]})).json()
    run = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Can they log in?",
                                                          "strategies": ["recompute"]}).json()
    queue = "model.smollm2-135m"

    def run_ids(key: str) -> list[int]:
        import base64
        import json

        bodies = [base64.b64decode(json.loads(m)["body"]) for m in r.lrange(key, 0, -1)]
        return [json.loads(body)[1]["run_id"] for body in bodies]

    assert run_ids(queue) == [run["id"]]  # the list a worker pops first
    assert sorted(run_ids(queue + "\x06\x169")) == sorted(e["run_id"] for e in sweep["edits"])
    r.flushdb()


def test_a_sweep_edit_runs_again_as_an_ordinary_run_with_attention(make_client, tmp_path: Path) -> None:
    """A sweep keeps no attention maps; its edit's run page says so and offers to run the edit
    again: the new run is an ordinary one (no sweep in its snapshot, so the worker computes its
    attention and counts nothing on the sweep)."""
    from data.db import get_sessionmaker
    from data.models import Run, RunResult

    client = make_client()
    nb = _with_field(client)
    sweep = client.post(f"/api/notebooks/{nb}/sweeps", json=_body(values={"status": ["banned"]})).json()
    edit = sweep["edits"][0]["run_id"]
    with get_sessionmaker()() as s:  # finished as a sweep's worker finishes it: statistics, no attention
        run = s.get(Run, edit)
        run.status, run.stage, run.progress = "succeeded", "done", 1.0
        s.add(RunResult(run_id=edit, strategy="recompute", decision="no", tokens_computed=40, tokens=None))
        s.commit()
    page = client.get(f"/runs/{edit}").text
    assert "This run stored no attention maps" in page and f'href="/sweeps/{sweep["id"]}"' in page
    assert "data-rerun-with-attention" in page
    again = client.post(f"/api/runs/{edit}/rerun")
    assert again.status_code == 201, again.text
    rerun = client.get(f"/api/runs/{again.json()['id']}").json()
    assert rerun["snapshot"]["sweep_id"] is None
    assert rerun["snapshot"]["fields"] == client.get(f"/api/runs/{edit}").json()["snapshot"]["fields"]
    with get_sessionmaker()() as s:
        assert s.get(Run, again.json()["id"]).sweep_id is None
    assert client.get(f"/api/sweeps/{sweep['id']}").json()["edits_total"] == 1
    assert again.json()["id"] in [m["run_id"] for _, m in _broker_messages(tmp_path)]
