"""One state: the run page's header and its progress bar say the same thing as the run moves
(the polled fragment replaces the header's badge out of band), and a run that ends while its
notebook is open shows its decision summary there without a click."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from data.models import Run
from tests.web.conftest import finished, session

HX = {"HX-Request": "true"}


@pytest.fixture
def client(make_client):
    return make_client()


def set_status(run_id: int, status: str) -> None:
    s = session()
    run = s.get(Run, run_id)
    run.status, run.stage, run.progress = status, status, 0.0 if status == "queued" else 0.4
    run.heartbeat_at = datetime.now(UTC)  # a live worker's beat: the watchdog leaves it running
    s.commit()


def badges(html: str) -> list[str]:
    return re.findall(r'<span class="badge (queued|running|succeeded|failed|cancelled)"', html)


def test_header_and_progress_agree_while_the_run_moves(client) -> None:
    _, run = finished(client)
    set_status(run, "queued")
    page = client.get(f"/runs/{run}").text
    assert badges(page) == ["queued", "queued"]  # the header's and the progress box's
    set_status(run, "running")
    polled = client.get(f"/runs/{run}/progress", headers=HX).text
    assert badges(polled) == ["running", "running"]  # the box, and the header's replacement
    assert 'hx-swap-oob="outerHTML:.page-head h1 > .badge"' in polled
    assert 'hx-trigger="every 1s"' in polled
    compact = client.get(f"/runs/{run}/progress?compact=1", headers=HX).text
    assert "hx-swap-oob=\"outerHTML" not in compact  # the notebook has no run header to replace


def test_a_run_that_ends_on_the_notebook_shows_its_decision_summary(client) -> None:
    nb, run = finished(client)
    set_status(run, "running")
    live = client.get(f"/notebooks/{nb}").text
    assert 'class="run-summary"' not in live and f'hx-get="/runs/{run}/progress?compact=1"' in live
    s = session()
    done = s.get(Run, run)
    done.status, done.stage, done.progress = "succeeded", "done", 1.0
    s.commit()
    polled = client.get(f"/runs/{run}/progress?compact=1", headers=HX).text
    assert 'hx-trigger="every 1s"' not in polled  # polling stops
    summary = polled[polled.index('class="run-summary"'):]
    rows = re.findall(r'<li data-strategy="(\w+)" class="(\w+)"', summary)
    assert rows == [("recompute", "reference"), ("prefix_reuse", "agrees"), ("stale", "disagrees"),
                    ("field_erratum", "agrees")]
    assert "run-headline" in summary and "of 3</strong>" in summary
    assert 'id="runs-table" hx-swap-oob="true"' in polled  # the history gains the finished run too
    # the page opened afterwards shows the same summary
    assert (re.findall(r'<li data-strategy="(\w+)"', client.get(f"/notebooks/{nb}").text)
            == [r[0] for r in rows])
