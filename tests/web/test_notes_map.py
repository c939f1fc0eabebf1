"""The notes map a reader can read, on real runs (the run task on a tiny model): spans on word
boundaries, the page saying plainly that each share is that patch alone, each field's own share by
name, and a placed skill drawn as a region in place."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tests.web.engine_run import engine_notebook, engine_run

pytestmark = pytest.mark.slow

DOC = ("Account record. status: active. region: north.\n\n"
       + "".join(f"2026-03-{d:02d} 09:{d:02d} Operations desk logged entry {d}.\n" for d in range(1, 4))
       + "\nOnly accounts whose status is active may log in.")
SKILL = "House rule: answer in one word.\n"


@pytest.fixture
def client(make_client):
    return make_client(KVNOTES_MODELS="tiny-llama,smollm2-135m")


def _on_boundary(text: str, at: int) -> bool:
    return at in (0, len(text)) or text[at - 1].isspace() or text[at].isspace()


def test_each_field_named_with_its_own_share_and_spans_on_word_boundaries(client) -> None:
    fields = [("active", "suspended", "status"), ("north", "south", "region")]
    run = engine_run(engine_notebook(DOC, fields), ["recompute", "stale", "in_place"], attribution=True)
    notes_map = client.get(f"/api/runs/{run}").json()["attribution"]
    spans = [s for s in notes_map["spans"] if s["start_char"] >= 0]
    assert len(spans) >= 3
    edges = {DOC.index("active"), DOC.index("active") + 6, DOC.index("north"), DOC.index("north") + 5}
    off = [s["text"] for s in spans
           if not all(_on_boundary(DOC, c) or c in edges for c in (s["start_char"], s["end_char"]))]
    assert off == []  # no span starts or ends mid-word, but at a field's edge (a region of its own)
    edits = notes_map["edits"]
    status_at, region_at = DOC.index("active"), DOC.index("north")
    assert [(e["start_char"], e["end_char"]) for e in edits] == [(status_at, status_at + 6),
                                                                 (region_at, region_at + 5)]
    html = client.get(f"/runs/{run}").text
    summary = re.search(r'<p class="map-summary">(.*?)</p>', html, re.S).group(1)
    status, region = (f"{100 * e['share']:.0f}%" for e in edits)
    assert f"the status field&#39;s own notes closed <strong>{status}</strong>" in summary
    assert f"the region field&#39;s own notes closed <strong>{region}</strong>" in summary
    assert f"all the fields together <strong>{100 * notes_map['field_share']:.0f}%</strong>" in summary
    how = re.search(r'<p class="map-how help">(.*?)</p>', html, re.S).group(1)
    assert "Each share is that patch alone" in how and "do not add up" in how
    left = 100 * notes_map["kl_in_place"] / notes_map["kl_stale"]
    assert f"which is {left:.1f}% of the whole" in how  # what a span's share is a share of
    svg = ET.fromstring(client.get(f"/runs/{run}/notes-map.svg").text)
    said = " ".join("".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "the status field's own notes closed" in said and "the region field's own notes closed" in said


def test_a_placed_skill_is_drawn_as_a_region_in_place(client) -> None:
    at = DOC.index("Only")
    nb = engine_notebook(DOC, [("active", "suspended", "status")], skill=(SKILL, at))
    run = engine_run(nb, ["recompute", "stale", "in_place"], attribution=True)
    notes_map = client.get(f"/api/runs/{run}").json()["attribution"]
    inside = [s for s in notes_map["spans"] if s["start_char"] < 0]
    assert inside, "the skill's own notes were patched as spans of their own"
    html = client.get(f"/runs/{run}").text
    doc = re.search(r'<div class="snapshot-doc map-doc">(.*?)</div>', html, re.S).group(1)
    skill_region = r'<span class="map-skill" data-skill="house rules"[^>]*>(.*?</span>)</span>'
    region = re.search(skill_region, doc, re.S)
    assert region is not None
    drawn = re.sub(r"<[^>]+>", "", region.group(1))
    assert drawn == "skill: house rules" + SKILL.rstrip("\n")  # the skill's text, once (its newline after it)
    coloured = re.findall(r'<span class="map-span[^>]*>(.*?)</span>', region.group(1), re.S)
    assert len(coloured) == len(inside)  # its own spans only: no span runs in from the document around it
    assert "".join(coloured) == SKILL.rstrip("\n")  # every character coloured by the span that read it
    plain = re.sub(r"<[^>]+>", "", doc)
    assert plain.index("skill: house rules") < plain.index("Only accounts")  # in place: before "Only"
    assert plain.index("skill: house rules") > plain.index("entry 3.")
    svg = ET.fromstring(client.get(f"/runs/{run}/notes-map.svg").text)
    said = "".join("".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "[skill: house rules] " + SKILL in said  # drawn in place, its text whole


def test_the_words_follow_what_carries_the_gap_and_negative_spans_are_listed(make_client) -> None:
    """A stored notes map (no engine): a negative span is listed with its sign explained; the
    sentence compares with the paper only when a document span leads, and names a skill that does."""
    from data.models import Run
    from tests.web.conftest import finished, session

    client = make_client()
    _, run_id = finished(client)
    s = session()
    run = s.get(Run, run_id)
    stored = run.attribution.model_dump()
    spans = stored["spans"]
    spans[0]["share"], spans[-1]["share"] = 0.30, -0.40  # the largest move is away from recompute
    run.attribution = {**stored, "field_share": 0.2, "spans": spans}
    s.commit()
    html = client.get(f"/runs/{run_id}").text
    listed = re.search(r'<ol class="top-spans">(.*?)</ol>', html, re.S).group(1)
    assert "-40.0%" in listed and "moved the decision further from recompute" in listed
    assert "as the paper found on large models" in html  # a document span leads the positive ones
    skill = {"start_char": -1, "end_char": -1, "text": "Before answering, check the status", "share": 0.72}
    run.attribution = {**stored, "field_share": 0.2, "spans": [*spans, skill]}
    s.commit()
    html = client.get(f"/runs/{run_id}").text
    assert "The largest share of the gap left is a placed skill's (72.0%)" in html
    assert "as the paper found on large models" not in html
