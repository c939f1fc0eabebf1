"""The Mechanism option on the run form, and the mechanism panel on what the worker stores: a
record with empty regions, a missing ranking and a run without a decision token each reads as a
line in the view, never an error page."""

from __future__ import annotations

import pytest

from data.contracts import KCurve, KnockoutRow, KPoint, MechanismRecord, MechControl, MechReading
from data.models import Run
from tests.web.conftest import HX, new_notebook, page_run, session


@pytest.fixture
def client(make_client):
    return make_client()


def _record() -> MechanismRecord:
    reading = MechReading(decision="suspended", p_answer=0.71, kl=0.02)
    control = MechControl(size=8, draws=5, p_answer=0.70, p_answer_spread=0.01, kl=0.01, kl_spread=0.004,
                          agreement=0.8)
    rows = [KnockoutRow(strategy="recompute", region="downstream_top8", layers="all", size=8,
                        reading=MechReading(decision="active", p_answer=0.2, kl=0.9), control=control,
                        agrees=False),
            KnockoutRow(strategy="recompute", region="errata", layers="all", size=0,
                        note="no errata in these notes")]
    points = [KPoint(k=k, reading=reading, agrees=k >= 4) for k in (0, 1, 2, 4, 8, 11)]
    curves = [KCurve(ranking="notes_map", points=[], k_star=None,
                     note="the notes map was not measured on this run (tick Notes map to rank by it)"),
              KCurve(ranking="attention", points=points, k_star=4)]
    return MechanismRecord(answer="sus", decision="suspended", shown="stale", unmasked={"recompute": reading},
                           knockout=rows, downstream=11, selective_k=curves,
                           logit_lens={"recompute": [0.0, 0.3, 0.9], "stale": [0.0, 0.1, 0.2]},
                           costs={"knockout": 0.4, "selective_k": 1.2, "logit_lens": 0.1})


def test_the_form_asks_for_the_mechanism(client) -> None:
    nb = new_notebook(client)
    form = client.get(f"/notebooks/{nb}").text
    assert 'name="mechanism"' in form and "Mechanism: why the decision moved" in form
    asked = {"question": "q?", "strategies": ["recompute"], "mechanism": "1"}
    client.post(f"/notebooks/{nb}/runs", data=asked, headers=HX)
    assert session().query(Run).one().snapshot.mechanism is True


def test_the_panel_draws_what_was_stored_and_says_what_was_not(client) -> None:
    _nb, _notebook, run = page_run(client)
    s = session()
    s.get(Run, run.id).mechanism = _record()
    s.commit()
    html = client.get(f"/runs/{run.id}").text
    assert html.count('class="knockout-row') == 2 and "no errata in these notes" in html
    assert "0.700 ± 0.010" in html and "4 of 5" in html  # the control: mean ± spread, draws that keep it
    assert html.count('class="k-curve"') == 1 and "K* = 4" in html and "not measured on this run" in html
    assert html.count('class="lens-strip"') == 2 and html.count('class="lens-cell"') == 6
    assert "knockout 0.40, selective@K 1.20, logit lens 0.10 recomputes (1.70 in all" in html
    # the exports, the report and the presentation carry the same record
    exported = client.get(f"/runs/{run.id}/export.json").json()["run"]["mechanism"]
    assert exported == _record().model_dump(mode="json")
    report = client.get(f"/runs/{run.id}/report.html").text
    assert report.count('class="knockout-row') == 2 and report.count('class="k-curve"') == 1
    assert report.count('class="lens-strip"') == 2
    slide = client.get(f"/runs/{run.id}/present/4").text
    assert "<strong>K* = 4</strong> of 11" in slide and slide.count('class="lens-strip"') == 2
    assert "knocking out downstream, top 8 positions (all layers, recompute) moves it to active" in slide
    # a run without a decision token: one line, no error page
    s.get(Run, run.id).mechanism = MechanismRecord(
        answer="", decision="", shown=None,
        notes=["recompute gave no answer token, so there is no decision to explain (an empty answer)"])
    s.commit()
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200 and "there is no decision to explain" in page.text
    assert 'class="knockout-row' not in page.text
