"""The Turns panel in Chromium, against the served app and a real worker on the bundled model: a
notebook with a status field; three turns added to the first with "+ Add a turn" (each typed into
its own row, one setting the status), one moved up, one deleted; the JSONL Start will send shown;
then Start, and the trajectory's page once the worker has read every turn: its verdicts, its three
drawings and the link to the offline report. Screenshots: test-artifacts/trajectory-turns.png
(the panel) and trajectory.png (the page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, ServedApp, api_call
from tests.web.conftest import ARTIFACTS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          "Only accounts whose status is active may log in; suspended accounts are refused.\n")
MODEL = "smollm2-135m"


def appends(page) -> list[str]:
    return page.eval_on_selector_all("#trajectory .turn-row textarea[name$='.append']",
                                     "ts => ts.map(t => t.value)")


def add_turn(page, text: str) -> None:
    """'+ Add a turn', then type what it appends into the new row (which has the focus)."""
    before = len(appends(page))
    page.click("#trajectory-add")
    page.wait_for_function(f"document.querySelectorAll('#trajectory .turn-row').length === {before + 1}")
    # the focus moves once the swapped panel has settled (after the rows appear: under load, later)
    want = f"turns.{before}.append"
    page.wait_for_function(f"document.activeElement && document.activeElement.name === '{want}'",
                           timeout=30_000)
    focused = page.evaluate("document.activeElement && document.activeElement.name")
    assert focused == want, focused
    page.keyboard.type(text)


def test_turns_written_one_by_one_then_started(tmp_path: Path, browser_page) -> None:
    from worker.engine.models import ensure_converted

    page, errors = browser_page
    (tmp_path / "models").symlink_to(ensure_converted(MODEL, REPO / "var" / "test-data").parent)
    with ServedApp(tmp_path, MODEL, worker=True) as server:
        api = f"{server.url}/api"
        nb = api_call(f"{api}/notebooks", "POST",
                      {"title": "Support agent", "model": MODEL, "text": RECORD})["id"]
        start = RECORD.index("active")
        api_call(f"{api}/notebooks/{nb}/fields", "POST",
                 {"start": start, "end": start + 6, "new_value": "suspended", "label": "status"})
        page.goto(f"{server.url}/notebooks/{nb}")
        page.wait_for_selector("#trajectory .turn-row")
        assert appends(page) == [""]  # one empty turn to start with
        page.fill("#turn-1-append", "\n[tool] lookup: 2 tickets open, last login 1h ago.")
        add_turn(page, "\n[tool] billing: the March invoice is unpaid.")
        page.fill("#turn-2-field-1", "suspended")
        add_turn(page, "\n[user] Why can't I log in?")
        add_turn(page, "\n[tool] a lookup written by mistake.")
        assert len(appends(page)) == 4
        # reorder: the user's message goes before the billing result
        page.click("button[aria-label='Move turn 3 up']")
        page.wait_for_function("document.querySelector('#turn-2-append').value.includes('[user]')")
        assert [a.split("]")[0] for a in appends(page)] == ["\n[tool", "\n[user", "\n[tool", "\n[tool"]
        assert page.input_value("#turn-3-field-1") == "suspended"  # the field moved with its turn
        page.wait_for_function("document.activeElement && document.activeElement.getAttribute('aria-label')"
                               " === 'Move turn 2 up'", timeout=30_000)  # the focus follows the moved turn
        page.click("button[aria-label='Delete turn 4']")
        page.wait_for_function("document.querySelectorAll('#trajectory .turn-row').length === 3")
        assert "Turn 4 deleted." in page.inner_text("#trajectory")
        # the focus goes to the last row left once the swap settles: wait for it, or a fill typed
        # meanwhile lands in that row (a CI run prefixed turn 3 with the question)
        page.wait_for_function("document.activeElement && document.activeElement.id === 'turn-3-append'",
                               timeout=30_000)
        page.fill("#trajectory-question", "Can Dana log in?")
        page.fill("#trajectory-choices", "yes, no")
        for name in ("stale", "field_erratum", "selective", "hoist"):  # fewer strategies: a shorter test
            page.uncheck(f"#trajectory input[name=strategies][value='{name}']")
        page.check("#trajectory input[name=strategies][value='erratum.one_per_field']")
        page.click("#trajectory summary")  # the JSONL box
        page.click("#trajectory button[value='export']")
        page.wait_for_selector("#trajectory-jsonl")
        sent = [json.loads(line) for line in page.input_value("#trajectory-jsonl").splitlines()]
        assert sent == [{"append": "\n[tool] lookup: 2 tickets open, last login 1h ago."},
                        {"append": "\n[user] Why can't I log in?"},
                        {"append": "\n[tool] billing: the March invoice is unpaid.",
                         "fields": {"status": "suspended"}}]
        page.locator("#trajectory").screenshot(path=str(ARTIFACTS / "trajectory-turns.png"))
        page.click("#trajectory button.primary")  # Start
        page.wait_for_url("**/trajectories/*")
        assert "of 3 turns" in page.inner_text("#trajectory-progress")
        page.wait_for_selector(".verdicts li", timeout=600_000)  # the page reloads once every turn is read
        trajectory_id = int(page.url.rsplit("/", 1)[1])
        t = api_call(f"{api}/trajectories/{trajectory_id}")
        assert t["status"] == "succeeded" and t["turns_done"] == 3, t.get("error")
        assert [turn["changed"] for turn in t["turns"]] == [[], [], ["status"]]
        assert t["strategies"] == ["recompute", "prefix_reuse", "in_place", "erratum",
                                   "erratum.one_per_field"]
        assert page.locator(".verdicts li").count() == len(t["verdicts"]) == 4
        assert page.locator("svg.trajectory-plot").count() == 3
        report = page.get_attribute("text=Offline report", "href")
        assert report == f"/trajectories/{trajectory_id}/report.html"
        page.screenshot(path=str(ARTIFACTS / "trajectory.png"), full_page=True)
        page.goto(f"{server.url}{report}")  # the offline report: the verdicts, a row per turn and strategy
        assert page.locator(".verdicts li").count() == 4 and page.locator("svg.trajectory-plot").count() == 3
        assert page.locator("tr[data-turn]").count() == 3 * 5
        page.screenshot(path=str(ARTIFACTS / "trajectory-report.png"), full_page=True)
    assert errors == []
