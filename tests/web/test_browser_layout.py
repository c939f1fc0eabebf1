"""Layout in real Chromium: presentation steps fit the screen at 1280×720 and 1400×900 (the
navigation on screen, no page scroll, long content scrolling inside the slide), a click on the
slide advances, dark slides are dark throughout, no page scrolls sideways at 390 px, and a run that
ends while its notebook is open shows its decision summary there. Screenshots go to
`test-artifacts/`."""

from __future__ import annotations

import pytest

from tests.conftest import ServedApp, chromium
from tests.web.conftest import ARTIFACTS, LONG_DOC

sync_api = chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = sync_api.expect

EVERY = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective", "hoist",
         "auto")
LONG_SKILL = "Style guide: answer in French, in one short sentence, and never name the carrier. " * 12

FITS = """() => {
  const nav = document.querySelector('.present-nav').getBoundingClientRect();
  const slide = document.querySelector('.slide:not([hidden])');
  const inner = [...slide.querySelectorAll('*')].filter(e => e.scrollHeight > e.clientHeight + 2
      && ['auto', 'scroll'].includes(getComputedStyle(e).overflowY)).length;
  return {page: document.scrollingElement.scrollHeight, height: innerHeight, navBottom: nav.bottom,
          navTop: nav.top, inner: inner, step: +document.body.dataset.step};
}"""

LIGHT_PANELS = """() => {
  const lum = c => { const m = c.match(/[\\d.]+/g); if (!m || (m.length > 3 && +m[3] === 0)) return null;
    const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(+m[0]) + 0.7152 * f(+m[1]) + 0.0722 * f(+m[2]); };
  const panels = [document.body, ...document.querySelectorAll(
      '.present-bar, .present-nav, .slide:not([hidden]) :is(.slide-doc, .heatmap, .decision-card, '
      + '.slide-note, .slide-side, .tokens, table, .table-wrap)')];
  return panels.filter(e => { const l = lum(getComputedStyle(e).backgroundColor);
                              return l !== null && l > 0.2; })
               .map(e => e.tagName + '.' + e.className);
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A long record run by every strategy with its notes map, a long skill in the library, and a
    notebook whose run is still going."""
    from app.services.notebooks import add_field
    from data.models import Notebook, Question, Skill
    from tests.web.finished_run import finished_run

    server = ServedApp(tmp_path_factory.mktemp("layout"), "smollm2-135m")
    ids: dict[str, int] = {}
    with server.db() as s:
        nb = Notebook(title="Long record, every strategy", model="smollm2-135m", document=LONG_DOC * 3)
        s.add(nb)
        s.flush()
        at = nb.document.index("active")
        add_field(s, nb, at, at + 6, "suspended", "status")
        nb.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
        s.commit()
        ids["run"] = finished_run(s, nb, strategies=EVERY, notes_map=True).id
        for _ in range(3):  # a history table with rows in it
            finished_run(s, nb, strategies=("recompute", "stale", "field_erratum"))
        ids["notebook"] = nb.id
        live = Notebook(title="A run that ends while you watch", model="smollm2-135m", document=LONG_DOC)
        s.add(live)
        s.flush()
        add_field(s, live, live.document.index("active"), live.document.index("active") + 6,
                  "suspended", "status")
        live.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
        s.commit()
        ids["live_run"] = finished_run(s, live, strategies=("recompute", "stale", "field_erratum")).id
        ids["live"] = live.id
        s.add(Skill(name="a house style with a long name that goes on and on: answer in French",
                    text=LONG_SKILL, model="smollm2-135m", status="compiled", token_count=260,
                    compile_ms=812.0))
        s.commit()
    ARTIFACTS.mkdir(exist_ok=True)
    yield server, ids
    server.stop()


@pytest.mark.parametrize("size", [(1280, 720), (1400, 900)])
def test_every_presentation_step_fits_with_its_navigation(site, browser, size) -> None:
    server, ids = site
    width, height = size
    page = browser.new_context(viewport={"width": width, "height": height}, bypass_csp=True).new_page()
    inner_scrolls = 0
    for step in (1, 2, 3, 4):
        page.goto(f"{server.url}/runs/{ids['run']}/present/{step}")
        fit = page.evaluate(FITS)
        page.screenshot(path=str(ARTIFACTS / f"40-present-{width}x{height}-step{step}.png"))
        assert fit["page"] <= height, (step, fit)  # no page scroll
        assert fit["navTop"] >= 0 and fit["navBottom"] <= height, (step, fit)  # the navigation on screen
        inner_scrolls += fit["inner"] > 0
    assert inner_scrolls >= 2  # the long document and the notes map scroll inside their slides
    page.context.close()


CARDS_SHOWN = """() => {
  const body = document.querySelector('#step-2 .slide-body').getBoundingClientRect();
  const nav = document.querySelector('.present-nav').getBoundingClientRect();
  return [...document.querySelectorAll('#step-2 .decision-card')].map(c => {
    const r = c.getBoundingClientRect(), big = c.querySelector('.decision-big');
    const mark = c.querySelector('.agree-mark');
    return {inside: r.top >= body.top - 1 && r.bottom <= Math.min(body.bottom, nav.top) + 1 && r.left >= 0
                    && r.right <= innerWidth,
            decision: parseFloat(getComputedStyle(big).fontSize),
            verdict: mark ? parseFloat(getComputedStyle(mark).fontSize) : 0};
  });
}"""


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_step_two_shows_every_strategys_card_without_scrolling(site, browser, size) -> None:
    """Nine strategies: every card inside the slide, its decision and verdict legible from the back."""
    server, ids = site
    width, height = size
    page = browser.new_context(viewport={"width": width, "height": height}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{ids['run']}/present/2")
    cards = page.evaluate(CARDS_SHOWN)
    page.screenshot(path=str(ARTIFACTS / f"44-present-step2-{width}x{height}.png"))
    assert len(cards) == len(EVERY) == 9
    assert all(c["inside"] for c in cards), cards
    assert min(c["decision"] for c in cards) >= 20 and min(c["verdict"] for c in cards) >= 14, cards
    page.context.close()


def test_a_click_on_the_slide_advances_and_dark_is_dark_throughout(site, browser) -> None:
    server, ids = site
    page = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{ids['run']}/present/1")
    page.click("#step-1 .slide-doc")  # the document is most of the slide
    expect(page.locator("body")).to_have_attribute("data-step", "2")
    page.click("#step-2 .decision-card >> nth=0")
    expect(page.locator("body")).to_have_attribute("data-step", "3")
    page.click("#step-3 .heatmap .tokens >> nth=0")
    expect(page.locator("body")).to_have_attribute("data-step", "4")
    assert page.url.endswith(f"/runs/{ids['run']}/present/4")
    page.keyboard.press("t")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    for step in (1, 2, 3, 4):
        page.goto(f"{server.url}/runs/{ids['run']}/present/{step}")
        assert page.evaluate(LIGHT_PANELS) == [], step
        page.screenshot(path=str(ARTIFACTS / f"41-present-dark-step{step}.png"))
    page.context.close()


PAGES_390 = ["home", "notebook", "run", "runs", "skills", "present", "compare", "report",
             "delete", "components", "login", "missing"]


@pytest.mark.parametrize("where", PAGES_390)
def test_no_page_scrolls_sideways_at_390px(site, browser, where) -> None:
    server, ids = site
    path = {"home": "/", "notebook": f"/notebooks/{ids['notebook']}",
            "run": f"/runs/{ids['run']}", "runs": "/runs",
            "skills": "/skills", "present": f"/runs/{ids['run']}/present/2",
            "compare": f"/compare?runs={ids['live_run']},{ids['run']}",
            "report": f"/runs/{ids['run']}/report.html",
            "delete": f"/notebooks/{ids['notebook']}/delete", "components": "/_components", "login": "/login",
            "missing": "/runs/987654"}[where]
    page = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                               bypass_csp=True).new_page()
    page.goto(server.url + path)
    page.screenshot(path=str(ARTIFACTS / f"42-390px-{where}.png"), full_page=True)
    if where == "notebook":  # the history table (four runs) fits without scrolling inside its box
        history = page.locator(".history-table")
        assert history.locator("tbody tr").count() >= 4
        history.screenshot(path=str(ARTIFACTS / "42-390px-history.png"))
        assert page.evaluate("""() => { const t = document.querySelector('.history-table');
            return [t.scrollWidth, t.closest('.table-wrap').scrollWidth]; }""")[1] <= 390
    width = page.evaluate("document.scrollingElement.scrollWidth")
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e => {
        const r = e.getBoundingClientRect(); return r.width && r.right > 391; }).slice(0, 6)
        .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
    page.context.close()
    assert width <= 390, (width, wide)


def test_header_follows_the_run_and_its_notebook_shows_the_summary_without_a_click(site, browser) -> None:
    from datetime import UTC, datetime

    from data.models import Run

    server, ids = site
    with server.db() as s:
        run = s.get(Run, ids["live_run"])
        run.status, run.stage, run.progress = "queued", "queued", 0.0
        s.commit()
    page = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{ids['live_run']}")
    expect(page.locator(".page-head h1 .badge")).to_have_text("queued")
    with server.db() as s:
        run = s.get(Run, ids["live_run"])
        run.status, run.stage, run.progress, run.heartbeat_at = ("running", "strategies", 0.5,
                                                                 datetime.now(UTC))
        s.commit()
    # one state: the header follows the progress box, which polls
    expect(page.locator(".page-head h1 .badge")).to_have_text("running", timeout=10_000)
    expect(page.locator("#run-progress .badge")).to_have_text("running")
    page.goto(f"{server.url}/notebooks/{ids['live']}")
    expect(page.locator("#run-progress .badge")).to_have_text("running")
    assert page.locator(".run-summary").count() == 0
    with server.db() as s:
        run = s.get(Run, ids["live_run"])
        run.status, run.stage, run.progress = "succeeded", "done", 1.0
        s.commit()
    expect(page.locator(".run-summary")).to_be_visible(timeout=10_000)
    expect(page.locator(".run-summary li")).to_have_count(3)
    expect(page.locator('.run-summary li[data-strategy="stale"]')).to_have_class("disagrees")
    page.locator("#run-progress").screenshot(path=str(ARTIFACTS / "43-notebook-run-summary.png"))
    page.context.close()


@pytest.mark.parametrize("width", [390, 1024, 1400])
def test_skills_shows_its_buttons_without_scrolling_the_table(site, browser, width) -> None:
    """A long skill name and text: every row's Recompile and Delete lie inside the visible table."""
    server, _ = site
    page = browser.new_context(viewport={"width": width, "height": 900}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/skills")
    page.screenshot(path=str(ARTIFACTS / f"45-skills-{width}.png"), full_page=True)
    clipped = page.evaluate("""() => [...document.querySelectorAll('tr[id^="skill-"] button')].filter(b => {
        const r = b.getBoundingClientRect(), w = b.closest('.table-wrap, table').getBoundingClientRect();
        return r.width === 0 || r.right > Math.min(w.right, innerWidth) + 1 || r.left < w.left - 1;
      }).map(b => b.textContent.trim())""")
    assert page.locator('tr[id^="skill-"] button').count() >= 2 and clipped == [], clipped
    page.context.close()


def test_starting_a_run_brings_its_progress_into_view(site, browser) -> None:
    """At 1400×900 on the long record, Run puts the whole progress box on screen (it was a sliver
    below the fold)."""
    server, ids = site
    page = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/notebooks/{ids['notebook']}")
    with page.expect_response(lambda r: r.url.endswith("/runs") and r.request.method == "POST") as started:
        page.click("#run-form button.run")
    assert started.value.status == 200, started.value.text()
    page.wait_for_selector("#run-progress .badge.queued")
    page.wait_for_function("() => !document.querySelector('#run-progress[data-reveal]')")
    page.wait_for_timeout(300)
    box = page.evaluate("() => { const r = document.querySelector('#run-progress').getBoundingClientRect();"
                        " return [r.top, r.bottom, innerHeight]; }")
    page.screenshot(path=str(ARTIFACTS / "46-run-started-progress.png"))
    assert 0 <= box[0] and box[1] <= box[2], box
    page.context.close()


def test_most_attended_offers_lines_and_sentences(site, browser) -> None:
    """The run page ranks lines and sentences (attention summed over their tokens) beside tokens;
    which leads follows the server's `lines_default`, and the reader's pick holds."""
    import json
    from urllib.request import urlopen

    server, ids = site
    run = ids["run"]
    with urlopen(f"{server.url}/runs/{run}/attention/paint?strategy=stale&rows=1") as r:
        paint = json.loads(r.read())
    assert paint["lines"].count("<tr ") == 10 and isinstance(paint["lines_default"], bool)
    page = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{run}?strategy=stale")
    page.wait_for_function("() => document.querySelector('#hm-top-lines tbody tr')")
    shown = "lines" if paint["lines_default"] else "tokens"
    assert page.is_checked(f'input[name="hm-top-by"][value="{shown}"]')
    page.check('input[name="hm-top-by"][value="lines"]')
    expect(page.locator("#hm-top-lines-box")).to_be_visible()
    expect(page.locator("#hm-top-tokens-box")).to_be_hidden()
    assert page.locator("#hm-top-lines tbody tr").count() == 10
    assert "logged routine entry number" in page.inner_text("#hm-top-lines tbody tr >> nth=0")  # a whole line
    page.locator("#hm-top-lines-box").screenshot(path=str(ARTIFACTS / "47-most-attended-lines.png"))
    page.check('input[name="hm-top-by"][value="tokens"]')
    expect(page.locator("#hm-top-tokens-box")).to_be_visible()
    page.context.close()


def test_the_first_slide_shows_a_placed_skill_as_a_region(site, browser) -> None:
    """Step 1's document box draws a placed skill as its own region, where it was spliced, named,
    as the run page's notes map draws one; on screen at 1280×720 without scrolling."""
    from app.services.notebooks import add_field
    from data.models import Notebook, Placement, Question, Skill
    from tests.web.finished_run import finished_run

    server, _ = site
    with server.db() as s:
        nb = Notebook(title="Record with a skill", model="smollm2-135m", document=LONG_DOC)
        skill = Skill(name="house rules", text="Before answering, check account_status in the session.",
                      model="smollm2-135m", status="compiled", token_count=12, compile_ms=40.0)
        s.add_all([nb, skill])
        s.flush()
        add_field(s, nb, LONG_DOC.index("active"), LONG_DOC.index("active") + 6, "suspended", "status")
        at = LONG_DOC.index("2026-03-01")
        s.add(Placement(notebook_id=nb.id, skill_id=skill.id, position=at))
        nb.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
        s.commit()
        s.refresh(nb)
        run = finished_run(s, nb, strategies=("recompute", "stale", "field_erratum")).id
    page = browser.new_context(viewport={"width": 1280, "height": 720}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs/{run}/present/1")
    region = page.locator("#step-1 .slide-doc .map-skill")
    expect(region).to_have_count(1)
    assert region.inner_text().startswith("skill: house rules")
    assert "check account_status in the session." in region.inner_text()
    doc = page.inner_text("#step-1 .slide-doc")  # in place: after the field's line, before the log
    assert doc.index("suspended") < doc.index("skill: house rules") < doc.index("2026-03-01")
    box, frame = region.bounding_box(), page.locator("#step-1 .slide-doc").bounding_box()
    bottom = min(frame["y"] + frame["height"], 720)
    assert box["height"] > 10 and frame["y"] <= box["y"] and box["y"] + box["height"] <= bottom, (box, frame)
    border = page.evaluate("getComputedStyle(document.querySelector('#step-1 .map-skill')).borderLeftWidth")
    page.screenshot(path=str(ARTIFACTS / "48-present-skill-region-1280x720.png"))
    assert border == "4px"
    page.context.close()


ZERO_TOKEN = """() => {
  const lum = c => { const m = c.match(/[\\d.]+/g);
    const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(+m[0]) + 0.7152 * f(+m[1]) + 0.0722 * f(+m[2]); };
  const out = {};
  for (const id of ['pr-ref', 'pr-res']) {  // a cell's title: "recompute a · strategy b", its panel's value
    const value = t => { const n = t.title.match(/[\\d.]+(?= ·|$)/g);
                         return n ? parseFloat(n[id === 'pr-ref' ? 0 : n.length - 1]) : NaN; };
    const toks = [...document.querySelectorAll('#' + id + ' .tok')];
    const low = toks.filter(t => !isNaN(value(t))).reduce((a, b) => value(b) < value(a) ? b : a);
    const panel = getComputedStyle(document.querySelector('#' + id).closest('.heatmap')).backgroundColor;
    const bgs = toks.map(t => lum(getComputedStyle(t).backgroundColor));
    out[id] = {value: value(low), bg: getComputedStyle(low).backgroundColor, panel: panel,
               lowLum: lum(getComputedStyle(low).backgroundColor), panelLum: lum(panel),
               lightest: Math.max(...bgs), darkest: Math.min(...bgs), cls: low.className};
  }
  return out;
}"""


@pytest.mark.parametrize("how", ["toggle", "system"])
def test_dark_slides_draw_tokens_on_the_dark_panel(site, browser, how) -> None:
    """Step 3 in dark (the T toggle, or the system's dark scheme): the tokens sit on the dark panel,
    on a scale that starts at the dark paper (the least attended dark where the light slide's is near
    white; test_attention_drawn_once checks a zero is the panel itself), in both attention panels."""
    server, ids = site
    context = browser.new_context(viewport={"width": 1280, "height": 720}, bypass_csp=True,
                                  color_scheme="dark" if how == "system" else "light")
    page = context.new_page()
    page.goto(f"{server.url}/runs/{ids['run']}/present/3")
    light = page.evaluate(ZERO_TOKEN)
    if how == "toggle":
        assert light["pr-ref"]["lowLum"] > 0.8 and light["pr-ref"]["panel"] == "rgb(255, 255, 255)", light
        page.keyboard.press("t")
        expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    dark = page.evaluate(ZERO_TOKEN)
    page.screenshot(path=str(ARTIFACTS / f"49-present-dark-tokens-{how}.png"))
    context.close()
    for side in ("pr-ref", "pr-res"):
        d = dark[side]
        assert d["panel"] == "rgb(27, 33, 48)", d  # the dark paper
        assert d["lowLum"] < 0.1, d  # the least attended: near the panel (a zero: the panel itself)
        assert d["lightest"] < 0.95, d  # no token on a white box
