"""The examples' runs as slides, in real Chromium (issue 51): every slide of every example's run fits
1280×720 with nothing under the navigation bar or cut at the side of its box, and names the edit
(the field, its old and new value) and the value each answer names, on screen without scrolling; at
390 px a card's value is never cut off. A speed-up whose paired range stays above 1× reads "at least
…×", never "noisy", and `/trajectories/N` is no wider than a 390 px screen. Screenshots go to
`test-artifacts/` (70-…)."""

from __future__ import annotations

import pytest

from tests.conftest import ServedApp, chromium
from tests.web.conftest import ARTIFACTS

sync_api = chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = sync_api.expect

# What a slide shows, measured: the frame is the screen between the bar and the navigation. Every
# element outside a scrolling box lies inside it; every scrolling box does too (what it holds is
# reached by scrolling it); no text runs past the side of the box that clips it; and the edit line
# sits whole in the frame.
MEASURE = """() => {
  const bar = document.querySelector('.present-bar').getBoundingClientRect();
  const nav = document.querySelector('.present-nav').getBoundingClientRect();
  const frame = {top: bar.bottom, bottom: nav.top, left: 0, right: innerWidth};
  const slide = document.querySelector('.slide:not([hidden])');
  const clips = e => { const s = getComputedStyle(e);
                       return s.overflowX !== 'visible' || s.overflowY !== 'visible'; };
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowY);
  const name = e => e.tagName.toLowerCase() + (e.className && e.className.baseVal === undefined
      ? '.' + String(e.className).trim().split(/\\s+/).join('.') : '') + ' "'
      + (e.textContent || '').trim().slice(0, 40) + '"';
  const under = [], cut = [];
  for (const e of slide.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (!r.width || !r.height || getComputedStyle(e).visibility === 'hidden') continue;
    let box = e.parentElement, scrolled = false;
    while (box && box !== slide && !clips(box)) box = box.parentElement;
    for (let a = e.parentElement; a && a !== slide; a = a.parentElement) if (scrolls(a)) scrolled = true;
    if (!scrolled && (r.top < frame.top - 1 || r.bottom > frame.bottom + 1 || r.right > frame.right + 1))
      under.push(name(e) + ' ' + Math.round(r.top) + '–' + Math.round(r.bottom));
    const own = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (own && box && box !== slide) {
      const b = box.getBoundingClientRect();
      if (r.right > b.right + 1 || r.left < b.left - 1)
        cut.push(name(e) + ' right ' + Math.round(r.right) + ' > ' + Math.round(b.right));
    }
  }
  const line = slide.querySelector('.slide-edit');
  const l = line ? line.getBoundingClientRect() : null;
  return {under: under.slice(0, 6), cut: cut.slice(0, 6), navTop: nav.top,
          line: l ? {top: l.top, bottom: l.bottom, text: line.textContent.replace(/\\s+/g, ' ').trim(),
                     old: [...line.querySelectorAll('.value-change del')].map(d => d.textContent),
                     new: [...line.querySelectorAll('.value-change ins')].map(d => d.textContent)} : null,
          cards: [...slide.querySelectorAll('.decision-card')].map(c => {
            const r = c.getBoundingClientRect(), v = c.querySelector('.answer-value');
            const big = c.querySelector('.decision-big');
            return {strategy: c.querySelector('.strategy').textContent.trim(),
                    value: v ? v.textContent : null, whole: big.scrollHeight <= big.clientHeight + 1,
                    shown: r.top >= frame.top - 1 && r.bottom <= frame.bottom + 1};
          })};
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The three examples loaded and run by every strategy, with notes maps and mechanisms."""
    from tests.web.example_runs import example_runs

    server = ServedApp(tmp_path_factory.mktemp("slides"), "gemma3-270m")
    with server.db() as s:
        runs = example_runs(s)
    ARTIFACTS.mkdir(exist_ok=True)
    yield server, runs
    server.stop()


def _edit(server, run_id: int) -> tuple[list, list[str]]:
    """The run's fields (label, old, new) and strategies, from its JSON export."""
    from tests.conftest import api_call

    exported = api_call(f"{server.url}/runs/{run_id}/export.json")
    snapshot = exported["run"]["snapshot"]
    return ([(f["label"], f["old"], f["new"]) for f in snapshot["fields"]],
            [d["strategy"] for d in exported["decisions"]])


def test_every_slide_of_the_examples_fits_1280x720_and_names_the_edit_and_each_answer(site, browser):
    server, runs = site
    page = browser.new_context(viewport={"width": 1280, "height": 720}, bypass_csp=True).new_page()
    problems = []
    for slug, run in runs.items():
        fields, strategies = _edit(server, run)
        steps = int(page.goto(f"{server.url}/runs/{run}/present/1") and page.locator("body")
                    .get_attribute("data-steps"))
        assert steps == 5, slug  # the mechanism has its own step
        for step in range(1, steps + 1):
            page.goto(f"{server.url}/runs/{run}/present/{step}")
            page.wait_for_timeout(100)  # present.js scrolls the boxes to what matters
            seen = page.evaluate(MEASURE)
            page.screenshot(path=str(ARTIFACTS / f"70-slide-{slug}-1280x720-step{step}.png"))
            where = f"{slug} step {step}"
            if seen["under"] or seen["cut"]:
                problems.append((where, seen["under"], seen["cut"]))
            line = seen["line"]
            assert line is not None and line["bottom"] <= seen["navTop"], (where, line)
            for label, old, new in fields:  # the field, its old and its new value, on screen
                assert label in line["text"] and [old] == line["old"] and [new] == line["new"], (where, line)
            if step == 2:  # each card names its answer's value, whole, above the navigation
                assert {c["strategy"] for c in seen["cards"]} == set(strategies), where
                assert all(c["shown"] and c["whole"] and c["value"] for c in seen["cards"]), \
                    (where, seen["cards"])
            else:  # the line says which value each strategy's answer names
                assert all(name in line["text"] for name in strategies), (where, line["text"])
    page.context.close()
    assert problems == [], problems


def test_at_390px_no_card_cuts_its_answer_s_value_and_no_slide_is_wider(site, browser):
    server, runs = site
    page = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                               bypass_csp=True).new_page()
    for slug, run in runs.items():
        page.goto(f"{server.url}/runs/{run}/present/2")
        cards = page.evaluate(MEASURE)["cards"]
        page.screenshot(path=str(ARTIFACTS / f"71-slide-{slug}-390-step2.png"), full_page=True)
        assert all(c["whole"] and c["value"] for c in cards), (slug, cards)
        stale = next(c for c in cards if c["strategy"] == "stale")
        assert stale["value"] in ("active", "Oslo"), (slug, stale)  # the old value, in sight
        for step in range(1, 6):
            page.goto(f"{server.url}/runs/{run}/present/{step}")
            assert page.evaluate("document.scrollingElement.scrollWidth") <= 390, (slug, step)
            assert "answers name" in page.inner_text(".slide:not([hidden]) .slide-edit") or step == 2
    page.context.close()


def test_a_tap_on_the_document_shows_its_token(site, browser):
    """"Hover for tokens" asked a touch screen for what it cannot do: the status says point at or
    tap, and a tap on a word shows its token."""
    server, runs = site
    with server.db() as s:
        from data.models import Run

        notebook = s.get(Run, runs["access-policy"]).notebook_id
    page = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True,
                               bypass_csp=True).new_page()
    page.goto(f"{server.url}/notebooks/{notebook}")
    expect(page.locator("#token-status")).to_contain_text("Point at or tap a word for its tokens")
    page.wait_for_function("document.getElementById('token-status').textContent.includes('document tokens')")
    page.tap("#document .t >> nth=2")
    expect(page.locator("#token-tip")).to_be_visible()
    expect(page.locator("#token-tip")).to_contain_text("token #")
    page.context.close()


def test_a_speed_up_range_above_1x_reads_at_least_never_noisy(site, browser):
    """The shipment log's strategies were faster than recompute in every paired round, by 5.1–22.2×
    for in_place: the run page, the cards and compare say "at least 5.1×"; prefix_reuse's 0.8–1.3×
    crosses 1× and stays "noisy … about the same"."""
    server, runs = site
    run = runs["shipment-log"]
    page = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{run}")
    cells = page.locator(".decision-table td.speedup-cell")
    page.locator(".decision-table").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "72-speedups-shipment-log.png"))
    row = page.locator('.decision-table tr[data-strategy="in_place"] td.speedup-cell')
    expect(row).to_contain_text("at least 5.1×")
    noisy = [t for t in cells.all_inner_texts() if "noisy" in t]
    assert noisy == ["noisy: 0.8–1.3×, about the same as recompute"], noisy
    assert " decode" not in page.locator(".decision-table").inner_text()  # a choice question: no decode time
    page.goto(f"{server.url}/runs/{run}/present/2")
    expect(page.locator('.decision-card.s-in_place .decision-facts')).to_contain_text("at least 5.1× faster")
    page.goto(f"{server.url}/compare?runs={runs['access-policy']},{run}")
    assert "noisy: 5.1" not in page.content() and "at least 5.1×" in page.content()
    assert "best <strong>at least 5.5×</strong> (stale)" not in page.content()  # stale does not agree
    assert "best <strong>at least 5.1×</strong> (in_place)" in page.content()  # every round faster
    page.context.close()


def test_a_trajectory_page_is_no_wider_than_390px_and_its_plots_stay_legible(site, browser):
    from tests.web.finished_trajectory import finished_trajectory

    server, _ = site
    long_append = ("\n[tool] lookup_account(id=40-1187-22) -> {\"status\": \"suspended\", "
                   "\"tickets_open\": 2, \"last_login\": \"2026-03-01T09:58:00Z\"}")
    with server.db() as s:
        tid = finished_trajectory(s, append=long_append)
    page = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                               bypass_csp=True).new_page()
    page.goto(f"{server.url}/trajectories/{tid}")
    page.evaluate("document.querySelectorAll('details.turn').forEach(d => { d.open = true; })")  # every turn
    page.screenshot(path=str(ARTIFACTS / "73-trajectory-390.png"), full_page=True)
    page.locator(".trajectory-plots figure >> nth=0").screenshot(
        path=str(ARTIFACTS / "73-trajectory-390-plot.png"))
    page.locator("#turn-1").screenshot(path=str(ARTIFACTS / "73-trajectory-390-turn.png"))
    width = page.evaluate("document.scrollingElement.scrollWidth")
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e => {
        const r = e.getBoundingClientRect(); return r.width && r.right > 391
          && !e.closest('.table-wrap, .trajectory-plots figure'); })
        .slice(0, 6).map(e => e.tagName + '.' + e.className + ' '
                         + Math.round(e.getBoundingClientRect().right))""")
    assert width <= 390 and wide == [], (width, wide)
    smallest = page.evaluate("""() => Math.min(...[...document.querySelectorAll('svg.trajectory-plot text')]
        .filter(t => t.textContent.trim()).map(t => t.getBoundingClientRect().height))""")
    assert smallest >= 9, smallest  # the plots' text was 5–6 px tall at this width
    page.context.close()
