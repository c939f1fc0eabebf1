"""A sweep's edits are the sweep's (issue 33 item 8): `GET /api/notebooks/{id}/runs` lists the
notebook's own runs, `?sweeps=true` adds the edits (each with its sweep_id); the notebook's
history hides them by default and marks them when shown; they are never the latest-run card, the
home page's latest run, or the run a new one offers to compare with."""

from __future__ import annotations

from tests.api.conftest import DOC, _notebook

RUN = {"question": "Can this customer log in?", "choices": ["yes", "no"],
       "strategies": ["recompute", "stale"]}


def test_after_a_three_edit_sweep_and_one_run_the_notebook_lists_the_one_run(make_client) -> None:
    client = make_client()
    nb = _notebook(client, DOC)["id"]
    start = DOC.index("active")
    field = {"start": start, "end": start + 6, "new_value": "banned", "label": "status"}
    assert client.post(f"/api/notebooks/{nb}/fields", json=field).status_code == 201
    first = client.post(f"/api/notebooks/{nb}/runs", json=RUN).json()
    sweep = client.post(f"/api/notebooks/{nb}/sweeps",
                        json={**RUN, "values": {"status": ["banned", "suspended", "closed"]}})
    assert sweep.status_code == 201, sweep.text
    sweep = sweep.json()
    edits = sorted(e["run_id"] for e in sweep["edits"])
    assert len(edits) == 3 and min(edits) > first["id"]  # the sweep's edits are the newest rows

    own = client.get(f"/api/notebooks/{nb}/runs").json()
    assert [r["id"] for r in own] == [first["id"]] and own[0]["sweep_id"] is None
    every = client.get(f"/api/notebooks/{nb}/runs?sweeps=true").json()
    assert [r["id"] for r in every] == [*reversed(edits), first["id"]]
    assert [r["sweep_id"] for r in every] == [sweep["id"]] * 3 + [None]

    page = client.get(f"/notebooks/{nb}").text
    assert f"Latest run #{first['id']}" in page and "3 sweep edits hidden" in page
    assert f'href="/runs/{edits[0]}"' not in page  # the history lists the notebook's own run only
    shown = client.get(f"/notebooks/{nb}?sweeps=1").text
    assert all(f'href="/runs/{e}"' in shown for e in edits)
    assert shown.count(f"sweep #{sweep['id']}</a>'s edit") == 3 and f"Latest run #{first['id']}" in shown
    home = client.get("/").text
    assert f"/runs/{first['id']}" in home and f"/runs/{edits[-1]}" not in home

    from data.db import get_sessionmaker
    from data.models import Notebook
    from tests.web.finished_run import finished_run

    with get_sessionmaker()() as s:  # the next run, finished as a worker writes one
        second = finished_run(s, s.get(Notebook, nb), strategies=("recompute", "stale")).id
    run_page = client.get(f"/runs/{second}").text
    assert f"Compare with #{first['id']}" in run_page and f"Compare with #{edits[-1]}" not in run_page
    assert [r["id"] for r in client.get(f"/api/notebooks/{nb}/runs").json()] == [second, first["id"]]
