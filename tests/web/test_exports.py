"""Exports that are exact: the heatmap SVG's tokens read back as the document (spaces, newlines and
markup characters kept), and the "Data (JSON)" link carries the view on screen."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from tests.web.conftest import finished

SVG = "{http://www.w3.org/2000/svg}"
DOC = ("SHIPMENT RECORD\nYou are  reading <a> record & its\tnotes.\nstatus: active\n\n"
       "SmolLM reads it; only accounts whose status is active may log in.")


@pytest.fixture
def client(make_client):
    return make_client()


def panel_text(root: ET.Element, panel: str, segment: str = "document") -> str:
    """The concatenated text of one panel's token elements of `segment`."""
    group = next(g for g in root.iter(f"{SVG}g") if g.get("data-panel") == panel)
    return "".join("".join(t.itertext()) for t in group.iter(f"{SVG}text")
                   if t.get("class") == "token" and t.get("data-segment") == segment)


def test_heatmap_svg_tokens_read_back_as_the_document(client) -> None:
    _, run = finished(client, doc=DOC)
    svg = client.get(f"/runs/{run}/heatmap.svg?strategy=stale")
    assert svg.status_code == 200
    root = ET.fromstring(svg.text)
    new_doc = DOC.replace("active", "suspended", 1)
    assert panel_text(root, "recompute") == new_doc
    assert panel_text(root, "stale") == DOC  # stale read the old document
    assert panel_text(root, "difference") == DOC
    assert panel_text(root, "recompute", "question") == "Question: status?"


def test_every_run_of_characters_sits_on_the_grid_by_itself(client) -> None:
    """Renderers collapse whitespace in SVG text, so no tspan mixes spaces with other characters and
    each visible one is stretched to its grid width: 'You are' cannot draw as 'Youare'."""
    _, run = finished(client, doc=DOC)
    root = ET.fromstring(client.get(f"/runs/{run}/heatmap.svg?strategy=stale").text)
    spans = [s for s in root.iter(f"{SVG}tspan")]
    assert len(spans) > 40
    for span in spans:
        text = span.text or ""
        assert text.isspace() or not any(c.isspace() for c in text), repr(text)
        if not text.isspace():
            assert float(span.get("textLength")) == pytest.approx(7.2 * len(text), abs=0.06)
    group = next(g for g in root.iter(f"{SVG}g") if g.get("data-panel") == "recompute")
    xs = {s.text: float(s.get("x")) for s in group.iter(f"{SVG}tspan") if s.text in ("You", "are")}
    assert xs["are"] - xs["You"] == pytest.approx(4 * 7.2, abs=0.06)  # "You" + one space


def test_data_json_link_carries_the_view_on_screen(client) -> None:
    _, run = finished(client)
    page = client.get(f"/runs/{run}?strategy=stale&layer=1&head=2&agg=max").text
    link = f'href="/runs/{run}/export.json?strategy=stale&amp;layer=1&amp;head=2&amp;agg=max"'
    assert link in page and f'data-view-link="/runs/{run}/export.json"' in page  # heatmap.js rewrites it
    data = client.get(f"/runs/{run}/export.json?strategy=stale&layer=1&head=2&agg=max").json()
    assert data["permalink"] == f"/runs/{run}?strategy=stale&layer=1&head=2&agg=max"
    assert data["view"]["strategy"] == "stale" and data["view"]["layer"] == 1 and data["view"]["head"] == 2


def test_a_run_has_one_json_shape_the_apis_in_the_export_and_the_report(client) -> None:
    """`/api/runs/{id}` is the same object inside `export.json` and inside the offline report's data."""
    _, run = finished(client)
    api = client.get(f"/api/runs/{run}").json()
    export = client.get(f"/runs/{run}/export.json").json()
    report = client.get(f"/runs/{run}/report.html").text
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                report, re.S).group(1))
    assert api["id"] == run and api["status"] == "succeeded"
    assert len(api["results"]) >= 2 and len(api["attention_regions"]) >= 2  # a full run, regions and all
    assert export["run"] == api
    assert data["run"] == api
