"""Sharing, presenting and comparing runs, through FastAPI's test client on a fresh database: the
permalink's view, the exports (JSON, CSV, SVG), the self-contained report, presentation steps,
the comparison of runs, and the error pages of the page routes (the API keeps JSON)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import xml.etree.ElementTree as ET

import pytest

from data.models import RunResult
from tests.web.conftest import DOC, STRATEGIES, finished, session
from tests.web.finished_run import HEADS, LAYERS


@pytest.fixture
def client(make_client):
    return make_client()


def test_permalink_opens_the_named_view_and_refuses_what_the_run_cannot_show(client) -> None:
    _, run = finished(client)
    html = client.get(f"/runs/{run}?strategy=field_erratum&layer=2&head=3&agg=max").text
    assert '<option value="field_erratum" selected>' in html
    assert 'data-view-agg="max" data-view-layer="2" data-view-head="3"' in html
    # the export links carry the view
    assert f'href="/runs/{run}/heatmap.svg?strategy=field_erratum&amp;layer=2&amp;head=3&amp;agg=max"' in html
    assert 'data-view-query="1"' in client.get(f"/runs/{run}?strategy=stale&query=1").text
    both = client.get(f"/runs/{run}?strategy=stale&layer=0&head=1&query=1&agg=max")  # a query keeps the rest
    assert both.status_code == 200
    assert 'data-view-layer="0" data-view-head="1" data-view-query="1"' in both.text
    for bad, words in (("strategy=nope", "has no attention for &#39;nope&#39;; "
                                         "choose one of prefix_reuse, stale, field_erratum"),
                       (f"layer={LAYERS}", f"layer={LAYERS} is out of range: this model has {LAYERS}"),
                       ("head=1", "a head is picked within a layer"),
                       ("query=99", "is past the question and answer tokens"),
                       ("agg=median", "agg is mean or max")):
        page = client.get(f"/runs/{run}?{bad}")
        assert page.status_code == 422, bad
        assert words in page.text, (bad, page.text[-600:])
        assert 'class="topbar"' in page.text  # in the app's layout


def test_page_routes_answer_errors_as_pages_and_the_api_as_json(make_client) -> None:
    client = make_client()
    client.app.add_api_route("/boom", lambda: 1 / 0)  # a page route that fails unexpectedly
    missing = client.get("/runs/987654")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert 'class="topbar"' in missing.text and "<h1 id=\"error-title\">Not found</h1>" in missing.text
    assert "run 987654 not found" in missing.text
    assert client.get("/no/such/page").status_code == 404
    assert "Not found" in client.get("/no/such/page").text
    bad = client.get("/runs/abc")
    assert (bad.status_code == 422 and "run_id: Input should be a valid integer" in bad.text
            and 'class="topbar"' in bad.text)
    assert client.get("/?page=0").status_code == 422
    api = client.get("/api/runs/987654")
    assert api.status_code == 404 and api.json() == {"detail": "run 987654 not found"}
    assert client.get("/api/runs/abc").json()["detail"][0]["loc"] == ["path", "run_id"]
    assert client.get("/runs/987654/export.json").json() == {"detail": "run 987654 not found"}
    from fastapi.testclient import TestClient

    quiet = TestClient(client.app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000),
                       raise_server_exceptions=False)
    boom = quiet.get("/boom")
    assert boom.status_code == 500 and 'class="topbar"' in boom.text and "Something went wrong" in boom.text
    assert "ZeroDivisionError" not in boom.text  # no stack trace in the page


def test_export_json_holds_what_the_page_shows(client) -> None:
    nb, run = finished(client)
    data = client.get(f"/runs/{run}/export.json?strategy=stale&layer=1&head=2").json()
    assert data["permalink"] == f"/runs/{run}?strategy=stale&layer=1&head=2"
    assert data["notebook"] == {"id": nb, "title": "Policy"}
    assert data["run"]["snapshot"]["document"] == DOC
    assert set(data["run"]["results"]) == set(STRATEGIES)
    assert data["verdict"]["agree"] == 2 and data["verdict"]["compared"] == 3
    assert [d["strategy"] for d in data["decisions"]] == list(STRATEGIES)
    stale = next(d for d in data["decisions"] if d["strategy"] == "stale")
    assert stale["same_decision"] is False and stale["speedup"] == pytest.approx(470 / 2.5)
    assert data["notes_map"]["field_share"] == 0.94
    # every strategy's edit verdict, and the decision's attention by region as the API carries it
    assert {d["strategy"]: d["edit_followed"] for d in data["decisions"]}["stale"] in ("old", "neither")
    regions = data["run"]["attention_regions"]
    assert regions and all(abs(sum(shares.values()) - 1) <= 0.01 for shares in regions.values())
    summary = data["attention"]["stale"]
    assert len(summary["decision_mean"]) == len(summary["tokens"]) == summary["shape"][2]
    assert [len(summary["head_diff"]), len(summary["head_diff"][0])] == [LAYERS, HEADS]
    # the view is the API's own numbers for that layer and head
    api = client.get(f"/api/runs/{run}/attention", params={"strategy": "stale", "layer": 1, "head": 2}).json()
    assert data["view"]["values"] == api["values"] and data["view"]["label"] == "layer 1, head 2"
    assert len(data["view"]["top_tokens"]) == 10


def test_export_csv_is_the_decision_table_and_safe_in_a_spreadsheet(client) -> None:
    _, run = finished(client)
    s = session()
    s.query(RunResult).filter_by(run_id=run, strategy="stale").one().decision = "=HYPERLINK(\"x\")"
    s.commit()
    response = client.get(f"/runs/{run}/export.csv")
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["strategy"] for r in rows] == list(STRATEGIES)
    assert rows[0]["same_decision"] == "True" and rows[0]["speedup"] == "1.0"
    assert rows[2]["decision"] == "'=HYPERLINK(\"x\")"  # a formula is kept as text
    assert rows[2]["choice_probs"] == "active: 0.8000; suspended: 0.2000"
    assert float(rows[3]["kl_to_recompute"]) == pytest.approx(0.012)
    assert {"edit_followed", "ttft_spread_ms", "too_short_to_time"} <= set(rows[0])


def test_heatmap_and_notes_map_pictures_are_svg(client) -> None:
    _, run = finished(client)
    svg = client.get(f"/runs/{run}/heatmap.svg?strategy=stale&query=1")
    assert svg.headers["content-type"] == "image/svg+xml"
    root = ET.fromstring(svg.text)
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "recompute" in texts and "stale" in texts and "difference" in texts
    assert any("query=1 (question and answer tokens counted from 0)" in t for t in texts)
    rects = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    tokens = len(client.get(f"/api/runs/{run}/attention?strategy=stale").json()["tokens"])
    assert len(rects) > 2 * tokens  # every token of recompute, stale and the difference has its box
    notes = ET.fromstring(client.get(f"/runs/{run}/notes-map.svg").text)
    assert any("closed 94%" in (t.text or "") for t in notes.iter("{http://www.w3.org/2000/svg}text"))
    _, plain = finished(client, notes_map=False, title="No map")
    assert client.get(f"/runs/{plain}/notes-map.svg").status_code == 404


def test_report_is_one_self_contained_file(client) -> None:
    doc = DOC + "\nSee https://example.org/static/terms and http://x.test/a."
    _, run = finished(client, doc=doc)
    response = client.get(f"/runs/{run}/report.html?strategy=stale")
    html = response.text
    assert "/static" not in html and "http://" not in html and "https://" not in html
    assert not re.search(r"""(?:src|href|action)\s*=\s*["'](?!#)""", html)  # nothing to load or follow
    assert ("<link" not in html and "@import" not in html
            and "url(" not in html.split("</style>")[0].split("<style>")[1])
    # the user's text keeps its URL as text (a character reference the browser shows as ':')
    assert "https&#58;//example.org&#47;static/terms" in html
    assert "Decision diff against recompute" in html and html.count('data-strategy="') == len(STRATEGIES)
    assert html.count('class="tok seg-') > 50 and "Which notes carry the decision" in html
    # the one inline script runs under the report's own policy, named by its hash
    script = re.search(r"<script>(.*?)</script>", html, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = response.headers.get_list("content-security-policy")
    assert policy == [f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
                      "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"]
    download = client.get(f"/runs/{run}/report.html?download=1")
    assert download.headers["content-disposition"] == f'attachment; filename="run-{run}-report.html"'


def test_presentation_steps_each_have_a_url(client) -> None:
    _, run = finished(client)
    first = client.get(f"/runs/{run}/present").text
    assert (re.search(r'id="step-1" data-step="1"[^>]*>', first)
            and 'id="step-1" data-step="1" aria-labelledby="s1-title">' in first)
    assert 'id="step-2" data-step="2" aria-labelledby="s2-title" hidden>' in first
    third = client.get(f"/runs/{run}/present/3?strategy=field_erratum").text
    assert 'id="step-3" data-step="3" aria-labelledby="s3-title">' in third
    assert f'href="/runs/{run}/present/4?strategy=field_erratum" rel="next"' in third  # links keep the view
    # the field, named
    assert "Refreshing the status field&#39;s own notes closed <strong>94%</strong>" in third
    assert client.get(f"/runs/{run}/present/5").status_code == 404
    # step 2 and compare lead with the run page's verdicts: who follows the edit, in the header's words
    second = client.get(f"/runs/{run}/present/2").text
    _, other = finished(client, title="Again")
    compared = client.get(f"/compare?runs={run},{other}").text
    for html in (second, compared):
        marks = re.findall(r'<span class="agree-mark[^"]*" data-followed="(\w*)">([^<]+)</span>', html)
        assert marks and "give recompute's decision" not in html and "agree with recompute" not in html
        assert all(text.startswith(("✓", "✗", "names", "the reference")) for _, text in marks), marks
    assert "steps 1 to 4" in client.get(f"/runs/{run}/present/5").text


def test_compare_two_runs_aligned_line_by_line(client) -> None:
    _, a = finished(client, title="Before")
    reworded = DOC.replace("Only accounts", "Just accounts")
    _, b = finished(client, doc=reworded, title="After")
    page = client.get(f"/compare?runs={a},{b}")
    assert page.status_code == 200
    html = page.text
    assert f'data-run="{a}"' in html and f'data-run="{b}"' in html
    assert "The documents differ" in html
    changed = re.findall(r'<div class="cell changed" role="cell">(.*?)</div>', html, re.S)
    assert [re.sub(r"<[^>]+>", "", c) for c in changed] == [  # one row: the reworded line
        "Only accounts whose status is active may log in.",
        "Just accounts whose status is active may log in."]
    assert html.count('data-strategy="') == len(STRATEGIES)  # the decisions table, one row per strategy
    assert client.get(f"/compare?runs={a}&runs={b}").status_code == 200  # the history's checkboxes
    assert client.get(f"/compare?runs={a}").status_code == 422
    assert "two or more runs" in client.get(f"/compare?runs={a}").text
    assert client.get(f"/compare?runs={a},x").status_code == 422
    assert client.get(f"/compare?runs={a},987654").status_code == 404
    assert client.get(f"/compare?runs={a},{b}&strategy=auto").status_code == 422
    assert "stale" in client.get(f"/compare?runs={a},{b}&strategy=stale").text


def test_the_report_draws_the_view_it_names_for_every_strategy(client) -> None:
    """The report from layer=2&head=3&agg=max names that view and draws it: the server's panels and
    the script's data for every strategy (switching strategy keeps the view)."""
    _, run = finished(client)
    report = client.get(f"/runs/{run}/report.html?strategy=stale&layer=2&head=3").text
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                report, re.S).group(1))
    assert "layer 2, head 3" in report
    labels = {name: s["paint"]["label"] for name, s in data["strategies"].items()}
    assert set(labels.values()) == {"layer 2, head 3"}, labels
    queried = client.get(f"/runs/{run}/report.html?strategy=stale&layer=2&query=1").text
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                queried, re.S).group(1))
    assert data["strategies"]["stale"]["paint"]["label"].startswith("query=1 ")


def test_a_revoked_share_link_says_so_where_nobody_can_sign_in(client) -> None:
    """Issue 51: on the default setup (no accounts) a revoked link names what happened, not a
    sign-in form nobody can use."""
    from data.accounts import create_share, revoke_share

    _, run = finished(client)
    with session() as s:
        link, token = create_share(s, run, None)
        s.commit()
        assert client.get(f"/share/{token}", follow_redirects=False).status_code == 303
        revoke_share(s, link)
        s.commit()
    page = client.get(f"/share/{token}")
    assert page.status_code == 404 and "This share link was revoked" in page.text
    assert 'type="password"' not in page.text and "Sign in to kvnotes" not in page.text
