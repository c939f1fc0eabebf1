"""Issue 43 in real Chromium: one meaning of "agrees" on the trajectory page (a wording difference
is not a disagreement, on the page, in the JSON and in the verdict sentence), the turns that
changed recompute's decision told apart from the turns where a field changed, the three charts on
one numbered turn axis, and the run and trajectory pages at 390 px without a sideways page scroll.
Screenshots: test-artifacts/43-*.png."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.conftest import ServedApp, chromium
from tests.web.conftest import ARTIFACTS, LONG_DOC
from tests.web.finished_run import finished_sweep, mechanism_record

sync_api = chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = sync_api.expect

PAGE_WIDTH = "() => document.scrollingElement.scrollWidth"
LONG_ANSWERS = {  # the value at the end of a long answer: a cut from the start would hide it
    "recompute": "The account holder's status, according to the record as it was updated this morning, "
                 "is suspended.",
    "hoist": "According to the record as it was updated this morning, the account holder's status is "
             "suspended.",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A served app (no worker) holding the wording trajectory and a run with a mechanism record."""
    from app.services.notebooks import add_field
    from data.models import Notebook, Question, RunResult
    from tests.web.finished_run import finished_run
    from tests.web.wording_trajectory import wording_trajectory

    server = ServedApp(tmp_path_factory.mktemp("agreement"), "smollm2-135m")
    with server.db() as s:
        nb = Notebook(title="Long record", model="smollm2-135m", document=LONG_DOC)
        s.add(nb)
        s.flush()
        at = nb.document.index("active")
        add_field(s, nb, at, at + 6, "suspended", "status")
        nb.questions.append(Question(text="What is the status?", choices=[]))
        s.commit()
        run = finished_run(s, nb, strategies=("recompute", "stale", "in_place", "field_erratum", "hoist"),
                           notes_map=True)
        run.mechanism = mechanism_record()
        for r in s.query(RunResult).filter_by(run_id=run.id):  # long answers: the value comes last
            r.decision = LONG_ANSWERS.get(r.strategy, r.decision)
        s.commit()
        ids = {"run": run.id, "trajectory": wording_trajectory(s)}
    review = "after the review of the record and of the notes and of the history"
    free = {"recompute": (f"The customer's account, {review}, is banned.", "new", 40),
            "erratum": (f"The customer's account is now banned, {review}.", "new", 24),
            "stale": ("The customer's account is active.", "old", 0)}
    ids["sweep"] = finished_sweep(server, free, question="What is the account's status?", choices=())[1]
    ARTIFACTS.mkdir(exist_ok=True)
    yield server, ids
    server.stop()


def test_a_wording_difference_agrees_on_the_page_in_the_json_and_in_the_verdict(site, browser) -> None:
    server, ids = site
    tid = ids["trajectory"]
    page = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/trajectories/{tid}")
    hoist = page.locator("details.turn tr[data-strategy='hoist'] td.agrees-cell")
    expect(hoist).to_have_count(4)
    assert [t.strip() for t in hoist.all_text_contents()] == ["yes"] * 4
    verdict = page.locator("ul.verdicts li[data-strategy='hoist']")
    expect(verdict).to_contain_text("hoist agreed on 2 (4 of 4 turns in all)")
    # stale matches recompute where both name "active" (turns 1 and 4), whatever the wording
    expect(page.locator("ul.verdicts li[data-strategy='stale']")).to_contain_text("(2 of 4 turns in all)")
    # the turns that changed recompute's decision (2, 3) are told apart from the field changes (2, 4)
    badges = page.locator("details.turn:has(.decisive-badge)")
    assert [d.get_attribute("id") for d in badges.all()] == ["turn-2", "turn-3"]
    drift = page.locator("svg.trajectory-plot >> nth=0")
    expect(drift.locator("rect.decisive-turn")).to_have_count(2)
    expect(drift.locator("line.field-change")).to_have_count(2)
    # one numbered turn axis, shared: the timeline's ticks stand under the drift chart's
    xs = page.evaluate("""() => [...document.querySelectorAll('svg.trajectory-plot')].map(svg =>
        [...svg.querySelectorAll('.turn-tick')].map(t => Math.round(t.getBoundingClientRect().x
            + t.getBoundingClientRect().width / 2)))""")
    assert len(xs) == 3 and xs[0] == xs[2] and len(xs[2]) == 4, xs
    ticks = page.locator("svg.trajectory-plot >> nth=2").locator(".y-tick")
    assert ticks.count() >= 3  # the timeline's y axis numbered between 0 and its top
    page.locator(".trajectory-plots").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "43-trajectory-1280.png"), full_page=True)
    with urllib.request.urlopen(f"{server.url}/trajectories/{tid}/export.json") as response:
        body = json.load(response)
    assert [t["results"]["hoist"]["agrees"] for t in body["turns"]] == [True] * 4
    assert [t["results"]["stale"]["agrees"] for t in body["turns"]] == [True, False, False, True]
    assert "hoist agreed on 2 (4 of 4 turns in all)" in body["verdicts"]["hoist"]
    page.context.close()


@pytest.mark.parametrize("what", ["run", "trajectory"])
def test_the_run_and_trajectory_pages_fit_390_px(site, browser, what: str) -> None:
    server, ids = site
    page = browser.new_context(viewport={"width": 390, "height": 844}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/{what}s/{ids[what]}")
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(ARTIFACTS / f"43-{what}-390.png"), full_page=True)
    width = page.evaluate(PAGE_WIDTH)
    assert width <= 390, f"the {what} page is {width} px wide at 390 px"
    page.context.close()


def test_cut_answers_keep_their_value_on_the_slide_and_in_the_sweep_table(site, browser) -> None:
    server, ids = site
    page = browser.new_context(viewport={"width": 1280, "height": 720}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{ids['run']}/present/2")
    for name in LONG_ANSWERS:
        value = page.locator(f".decision-card.s-{name} .decision-big mark.answer-value")
        expect(value).to_have_text("suspended")
        expect(value).to_be_visible()  # not clamped away
        box = value.bounding_box()
        shown = page.locator(f".decision-card.s-{name} .decision-big").bounding_box()  # clamped to 2 lines
        assert box["y"] + box["height"] <= shown["y"] + shown["height"] + 1, (box, shown)
    page.screenshot(path=str(ARTIFACTS / "43-present-step2-1280.png"))
    page.goto(f"{server.url}/sweeps/{ids['sweep']}")
    cells = page.locator("#edits tbody tr >> nth=0").locator("td")
    expect(page.locator("#edits tbody tr >> nth=0").locator("mark.answer-value")).to_have_count(2)
    marks = page.locator("#edits tbody tr >> nth=0").locator(".agree-mark")
    # erratum names banned as recompute does, stale keeps "active"
    assert marks.all_text_contents() == ["✓", "✗"], marks.all_text_contents()
    assert "banned" in cells.all_text_contents()[-3]  # erratum's cut answer, stale's after it
    page.context.close()


def test_a_queued_run_names_what_its_worker_still_does(site, browser) -> None:
    """A worker for both models converting gemma3-270m first: the smollm2-135m run waiting behind it
    says so, with the tensors converted so far, not only "Waiting for a worker"."""
    from data import workers
    from data.models import Run
    from data.queue import queue_for

    server, ids = site
    step = "converting gemma3-270m (first use): 120 of 236 tensors"
    with server.db() as s:
        done = s.get(Run, ids["run"])
        queued = Run(notebook_id=done.notebook_id, snapshot=done.snapshot, strategies=list(done.strategies),
                     status="queued", stage="queued", progress=0.0)
        s.add(queued)
        workers.register(s, "kvnotes-both-43@host", [queue_for("smollm2-135m"), queue_for("gemma3-270m")],
                         "host", 1, starting=step)
        s.commit()
        run_id = queued.id
    page = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{run_id}")
    expect(page.locator("#run-progress .worker-step")).to_contain_text(f"it is {step}")
    page.context.close()


GROUPS = """() => {
  const edges = [...document.querySelectorAll('.decision-table thead tr:not(.groups) th')]
      .filter(th => th.offsetParent).map(th => th.getBoundingClientRect());
  return [...document.querySelectorAll('.decision-table tr.groups th')].filter(th => th.offsetParent)
      .map(th => { const r = th.getBoundingClientRect();
        return {text: th.textContent, left: edges.some(e => Math.abs(e.left - r.left) < 1),
                right: edges.some(e => Math.abs(e.right - r.right) < 1),
                columns: edges.filter(e => e.left >= r.left - 1 && e.right <= r.right + 1).length}; });
}"""


def test_the_column_groups_the_timings_and_the_gateway_read_right(site, browser) -> None:
    server, ids = site
    page = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{ids['run']}")
    page.get_by_label("All columns").check()
    groups = page.evaluate(GROUPS)
    assert all(g["left"] and g["right"] for g in groups), groups
    first = next(g for g in groups if g["text"] == "First token")
    assert first["columns"] == 2, groups  # KL and the top token, both first-token readings
    expect(page.locator(".timing-line").first).to_have_text("prefill: 420 ms")
    expect(page.locator(".decision-table th", has_text="Choice probabilities")).to_have_count(1)
    page.goto(f"{server.url}/runs")  # the sweep's 3 edits are on its page, counted only
    expect(page.locator(".runs-sweep-edits")).to_have_text("Not listed: 3 sweep edits that ran, on their "
                                                           "sweeps' pages.")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Gateway").click()
    expect(page.locator(".gateway-setup")).to_contain_text("KVNOTES_GATEWAY_UPSTREAM=URL")
    expect(page.locator("#gateway-bases")).not_to_contain_text("send a request")
    page.context.close()
