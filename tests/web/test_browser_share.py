"""Share, present, compare and manage, in real headless Chromium against the real app (uvicorn on
a free port, finished runs written into its database as a worker writes them):

- a permalink round trip (the view opens from the URL, and the URL follows the view in place);
- the report with every request outside it blocked, served (under its own CSP) and as a file offline;
- presentation steps by keyboard and by click, dark and light;
- a comparison reached from a notebook's history;
- rename, duplicate and delete (with the confirmation);
- a field made by keyboard only, by selection and by "find text", with a visible focus at each stop;
- no horizontal scroll at 390 px, WCAG AA text contrast, and an HTML 404 for a missing run.

Screenshots of each go to `test-artifacts/`. Pages the CSP must govern (the report) run without
`bypass_csp`; the others bypass it only so the test's own waits may evaluate script.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ServedApp, chromium
from tests.web.conftest import ARTIFACTS, LONG_DOC
from tests.web.conftest import BROWSER_DOC as DOC

sync_api = chromium()

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = sync_api.expect

CONTRAST_AUDIT = """() => {
  function parse(c) {
    let m = c.match(/^rgba?\\(([^)]+)\\)/);
    if (m) {
      const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = c.match(/^color\\(srgb ([\\d.e-]+) ([\\d.e-]+) ([\\d.e-]+)(?: \\/ ([\\d.e-]+))?\\)/);
    if (m) return [m[1] * 255, m[2] * 255, m[3] * 255, m[4] === undefined ? 1 : +m[4]];
    return null;
  }
  function over(top, under) {
    const a = top[3];
    return [0, 1, 2].map(k => top[k] * a + under[k] * (1 - a)).concat([1]);
  }
  function lum(c) {
    const l = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2];
  }
  function background(el) {  // the colours under `el`, composited down to the first opaque one
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.backgroundImage !== "none"
          && !cs.backgroundImage.startsWith("repeating-linear-gradient")) return null;
      const c = parse(cs.backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  }
  const bad = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let checked = 0;
  while (walker.nextNode()) {
    const node = walker.currentNode, el = node.parentElement;
    const skipped = "[hidden], .sr-only, [aria-hidden=true], option, script, style, :disabled, "
                    + "[aria-disabled=true], .disabled";
    if (!node.data.trim() || !el || el.closest(skipped)) continue;
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    if (!r.width || !r.height || cs.visibility === "hidden") continue;
    const bg = background(el), fg = parse(cs.color);
    if (!bg || !fg) continue;
    const c = over(fg, bg), x = lum(c), y = lum(bg);
    const ratio = (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
    const size = parseFloat(cs.fontSize), large = size >= 24 || (size >= 18.66 && +cs.fontWeight >= 700);
    checked++;
    if (ratio < (large ? 3 : 4.5)) {
      bad.push(node.data.trim().slice(0, 24) + " " + ratio.toFixed(2) + ":1 " + cs.color
               + " on " + bg.map(Math.round));
    }
  }
  return {checked: checked, bad: bad.slice(0, 20)};
}"""


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The app with: a long record and two runs (one with the notes map), the same record reworded
    and its run, a short record for keyboard editing, and a notebook with runs to manage."""
    from app.services.notebooks import add_field
    from data.models import Notebook, Question
    from tests.web.finished_run import finished_run

    server = ServedApp(tmp_path_factory.mktemp("share"), "smollm2-135m")
    ids: dict[str, int] = {}
    with server.db() as s:
        def notebook(title: str, doc: str) -> Notebook:
            nb = Notebook(title=title, model="smollm2-135m", document=doc)
            s.add(nb)
            s.flush()
            at = doc.index("active")
            add_field(s, nb, at, at + 6, "suspended", "status")
            nb.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
            s.commit()
            return nb

        long = notebook("Long record", LONG_DOC)
        ids["run"] = finished_run(s, long, strategies=("recompute", "prefix_reuse", "stale", "field_erratum"),
                                  notes_map=True).id
        ids["earlier"] = finished_run(s, long, strategies=("recompute", "stale", "field_erratum")).id
        ids["long"] = long.id
        reworded = notebook("Long record, reworded", LONG_DOC.replace("Only accounts", "Just accounts"))
        ids["reworded_run"] = finished_run(s, reworded, strategies=("recompute", "stale", "field_erratum")).id
        ids["reworded"] = reworded.id
        short = Notebook(title="Keyboard only", model="smollm2-135m", document=DOC)
        s.add(short)
        s.commit()
        ids["short"] = short.id
        managed = notebook("Quarterly access review", DOC)
        finished_run(s, managed)
        finished_run(s, managed)
        ids["managed"] = managed.id
    ARTIFACTS.mkdir(exist_ok=True)
    yield server, ids
    server.stop()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, errors


def status_is(page, text: str) -> None:
    """The view `text` has finished loading (while loading the status reads "loading <text>…")."""
    expect(page.locator("#hm-status")).to_have_text(re.compile("^" + re.escape(text)), timeout=10_000)


def test_permalink_round_trip(site, page) -> None:
    server, ids = site
    run = ids["run"]
    page.goto(f"{server.url}/runs/{run}?strategy=field_erratum&layer=2&head=3")
    status_is(page, "layer 2, head 3")
    assert page.input_value("#hm-strategy") == "field_erratum"
    assert page.get_attribute('#hm-grid button[data-layer="2"][data-head="3"]', "aria-pressed") == "true"
    depth = page.evaluate("history.length")
    page.click('#hm-grid button[data-layer="0"][data-head="1"]')
    status_is(page, "layer 0, head 1")
    assert page.url.endswith(f"/runs/{run}?strategy=field_erratum&layer=0&head=1")
    page.select_option("#hm-strategy", "stale")
    status_is(page, "layer 0, head 1")
    assert "strategy=stale&layer=0&head=1" in page.url
    page.click('#hm-grid button.axis[data-layer="0"]')  # the whole layer, then max over its heads
    page.click('[data-agg="max"]')
    status_is(page, "layer 0, max over heads")
    assert page.url.endswith(f"/runs/{run}?strategy=stale&layer=0&agg=max")
    page.select_option("#hm-query", "1")  # a query keeps every other control in the address
    query_view = "query=1 (question and answer tokens counted from 0)"
    status_is(page, query_view)
    assert "the decision's view (layer 0, max over heads) is kept" in page.inner_text("#hm-status")
    assert page.url.endswith(f"/runs/{run}?strategy=stale&layer=0&query=1&agg=max")
    assert page.evaluate("history.length") == depth  # the URL was rewritten in place, no entry per change
    assert (page.get_attribute('a[data-view-link$="report.html"]', "href")
            == f"/runs/{run}/report.html?strategy=stale&layer=0&query=1&agg=max")
    page.reload()
    status_is(page, query_view)
    assert page.input_value("#hm-strategy") == "stale" and page.input_value("#hm-query") == "1"
    assert page.locator("#hm-res .tok.query").count() == 1
    assert page.get_attribute('[data-agg="max"]', "aria-pressed") == "true"
    options = page.eval_on_selector_all("#hm-query option", "os => os.map(o => o.textContent)")
    assert len(options) == len(set(options)) and sum("decision" in o for o in options) == 1, options
    shot(page, "20-permalink-query-view")
    page.select_option("#hm-query", "")  # back to the decision: the layer and max come back with it
    status_is(page, "layer 0, max over heads")
    assert page.url.endswith(f"/runs/{run}?strategy=stale&layer=0&agg=max")
    page.click('#hm-grid button[data-layer="2"][data-head="3"]')
    status_is(page, "layer 2, head 3")
    page.click("#hm-res .tok.seg-question >> nth=1")  # a question token picked in the panel
    status_is(page, "query=1")
    assert "layer=2&head=3&query=1" in page.url
    page.reload()
    status_is(page, "query=1")
    assert "(layer 2, head 3) is kept" in page.inner_text("#hm-status")
    # the exports menu: data, table and pictures of this view
    page.click(".run-actions summary")
    with page.expect_download() as png:
        page.click("text=Heatmap (PNG)")
    path = png.value.path()
    assert (png.value.suggested_filename == f"run-{run}-heatmap.png"
            and Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n")
    data = json.loads(page.request.get(f"{server.url}/runs/{run}/export.json").text())
    assert data["run"]["id"] == run and data["decisions"][0]["strategy"] == "recompute"
    assert (page.request.get(f"{server.url}/runs/{run}/export.csv").text()
            .startswith("strategy,decision,same_decision"))


def test_report_renders_with_every_outside_request_blocked(site, browser, tmp_path: Path) -> None:
    server, ids = site
    url = f"{server.url}/runs/{ids['run']}/report.html?strategy=stale"
    # served: only the report itself may load; the app's CSP is not bypassed (the report's own applies)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    blocked: list[str] = []

    def only_the_report(route) -> None:
        if route.request.url == url:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_report)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url)
    check_report(page, "21-report-served")
    assert blocked == [] and errors == [], (blocked, errors)
    html = page.content()
    context.close()
    # as a file, with the network off
    saved = tmp_path / "report.html"
    with urllib.request.urlopen(url) as response:
        saved.write_bytes(response.read())
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    file_url = saved.as_uri()

    def only_the_file(route) -> None:
        if route.request.url == file_url:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_file)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(file_url)
    check_report(page, "22-report-offline-file")
    assert errors == [] and blocked == [], (errors, blocked)
    context.close()
    assert "Decision diff against recompute" in html


def check_report(page, name: str) -> None:
    rows = page.locator(".decision-table tbody tr")
    expect(rows).to_have_count(4)
    assert page.locator(".decision-table tr.disagrees").count() == 1
    assert page.locator("#rp-res .tok").count() > 100 and page.locator("#rp-diff .tok").count() > 100
    assert page.locator("#notes-map .map-span").count() > 5
    assert page.locator(".answers .answer").count() == 4
    # the inline script ran: the strategy picker shows, and picking repaints the panels
    expect(page.locator("#rp-strategy")).to_be_visible()
    page.select_option("#rp-strategy", "prefix_reuse")
    expect(page.locator("[data-res-title]")).to_have_text("prefix_reuse")
    expect(page.locator("#rp-top thead [data-col=strategy]")).to_have_text("prefix_reuse")
    assert page.locator("#rp-res .tok").count() > 100
    shot(page, name)


def test_presentation_steps_by_keyboard_and_click(site, page) -> None:
    server, ids = site
    run = ids["run"]
    page.goto(f"{server.url}/runs/{run}/present")
    expect(page.locator("#step-1")).to_be_visible()
    assert page.locator(".slide:visible").count() == 1
    shot(page, "23-present-1-edit")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#step-2")).to_be_visible()
    assert page.url.endswith(f"/runs/{run}/present/2")
    assert (page.locator(".decision-card").count() == 4
            and page.locator(".decision-card.disagrees").count() == 1)
    shot(page, "24-present-2-decisions")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#step-3")).to_be_visible()
    assert page.locator("#pr-res .tok").count() > 100
    shot(page, "25-present-3-attention")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#step-4")).to_be_visible()
    assert page.url.endswith("/present/4") and page.locator("#step-4 .map-span").count() > 5
    page.keyboard.press("ArrowRight")  # the last step stays
    assert page.url.endswith("/present/4")
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#step-3")).to_be_visible()
    assert page.url.endswith("/present/3")
    page.click("#step-3 .slide-kicker")  # a click on the slide moves on
    expect(page.locator("#step-4")).to_be_visible()
    page.keyboard.press("t")  # dark, and remembered
    assert page.get_attribute("html", "data-theme") in ("dark", "light")
    theme = page.get_attribute("html", "data-theme")
    shot(page, f"26-present-4-notes-{theme}")
    page.keyboard.press("Home")
    expect(page.locator("#step-1")).to_be_visible()
    page.reload()
    assert page.get_attribute("html", "data-theme") == theme
    page.goto(f"{server.url}/runs/{run}/present/2")  # a step's own URL opens that step
    expect(page.locator("#step-2")).to_be_visible()
    assert page.locator("#step-1").is_hidden()


def test_compare_two_runs_from_the_notebook_history(site, page) -> None:
    server, ids = site
    page.goto(f"{server.url}/notebooks/{ids['long']}")
    page.check(f"#cmp-{ids['run']}")
    page.check(f"#cmp-{ids['earlier']}")
    page.click("text=Compare the ticked runs")
    page.wait_for_url("**/compare?**")
    assert page.locator(".run-card").count() == 2
    # recompute, prefix_reuse, stale, field_erratum
    assert page.locator(".compare-table tbody tr").count() == 4
    assert (page.locator(".compare-table tbody tr[data-strategy=prefix_reuse] td").nth(2).inner_text().strip()
            == "not run")
    shot(page, "27-compare-same-document")
    # documents that differ: the reworded line sits on its own marked row, in line across the runs
    page.goto(f"{server.url}/compare?runs={ids['run']},{ids['reworded_run']}")
    changed = page.locator(".aligned .cell.changed")
    assert [changed.nth(i).inner_text().strip() for i in range(changed.count())] == [
        f"{word} accounts whose status is active may log in." for word in ("Only", "Just")]
    tops = [changed.nth(i).bounding_box()["y"] for i in range(2)]
    assert tops[0] == tops[1]
    assert page.locator(".aligned .cell span[style]").count() > 100  # coloured by attention
    shot(page, "28-compare-reworded")


def test_rename_duplicate_and_delete(site, page) -> None:
    server, ids = site
    nb = ids["managed"]
    page.goto(f"{server.url}/notebooks/{nb}")
    page.focus(".notebook-actions summary")
    page.keyboard.press("Enter")  # the rename form opens from the keyboard
    expect(page.locator("#rename-title")).to_be_visible()
    page.fill("#rename-title", "Access review, Q3")
    shot(page, "29-rename")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/notebooks/{nb}")
    expect(page.locator("h1")).to_have_text("Access review, Q3")
    page.click("text=Duplicate")
    page.wait_for_url(re.compile(rf".*/notebooks/(?!{nb}$)\d+$"))
    expect(page.locator("h1")).to_have_text("Copy of Access review, Q3")
    assert page.locator("#document .field-chip").count() == 1
    assert "No runs yet" in page.inner_text("#history")
    page.goto(f"{server.url}/notebooks/{nb}")
    page.click("text=Delete…")
    expect(page.locator(".consequence")).to_contain_text("also deletes its 2 runs")
    shot(page, "30-delete-confirmation")
    page.click("text=Delete the notebook and its 2 runs")
    page.wait_for_url("**/?deleted=**")
    expect(page.locator(".flash-msg")).to_have_text("Deleted notebook “Access review, Q3” and its 2 runs.")
    assert page.locator(f'a[href="/notebooks/{nb}"]').count() == 0
    assert page.locator("text=Copy of Access review, Q3").count() == 1
    shot(page, "31-after-delete")


def focus_by_tab(page, selector: str, limit: int = 80) -> list[dict]:
    """Press Tab until `selector` has the focus; every stop's focus ring, as drawn."""
    stops = []
    for _ in range(limit):
        page.keyboard.press("Tab")
        stop = page.evaluate("""() => { const e = document.activeElement, cs = getComputedStyle(e);
            return {tag: e.tagName, id: e.id, text: (e.innerText || e.value || '').slice(0, 30),
                    outline: cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) >= 2
                             ? cs.outlineWidth : '',
                    shadow: cs.boxShadow !== 'none'}; }""")
        stops.append(stop)
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return stops
    raise AssertionError(f"{selector} not reached by Tab: {stops}")


def test_a_field_by_keyboard_only(site, page) -> None:
    server, ids = site
    page.goto(f"{server.url}/notebooks/{ids['short']}")
    stops = focus_by_tab(page, "#document")
    assert all(s["outline"] or s["shadow"] for s in stops), [
        s for s in stops if not (s["outline"] or s["shadow"])]
    at = DOC.index("active")
    for _ in range(at):
        page.keyboard.press("ArrowRight")
    expect(page.locator(".kbd-caret")).to_be_visible()
    for _ in range(len("active")):
        page.keyboard.press("Shift+ArrowRight")
    assert page.evaluate("String(getSelection())") == "active"
    page.keyboard.press("Enter")
    expect(page.locator("#selection-form")).to_be_visible()
    assert page.inner_text("#selection-form [data-quote]") == "active"
    assert page.evaluate("document.activeElement.id") == "sel-label"
    page.keyboard.type("status")
    page.keyboard.press("Tab")
    page.keyboard.type("suspended")
    shot(page, "32-field-by-keyboard-selection")
    page.keyboard.press("Enter")
    expect(page.locator("#document .field-chip .new")).to_have_text("suspended")
    # the other way: find the second "active" and make it a field
    focus_by_tab(page, "#find-field summary", limit=120)
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "find-text"
    page.keyboard.type("active")
    page.keyboard.press("Tab")
    page.keyboard.press("Control+a")
    page.keyboard.type("2")
    page.keyboard.press("Tab")
    page.keyboard.type("rule")
    page.keyboard.press("Tab")
    page.keyboard.type("closed")
    page.keyboard.press("Enter")
    expect(page.locator("#document .field-chip")).to_have_count(2)
    expect(page.locator("#find-field .flash-msg")).to_contain_text("Made a field of “active”")
    expect(page.locator("#find-text")).to_be_focused()  # ready for the next one
    shot(page, "33-field-by-find-text")


@pytest.mark.parametrize("where", ["home", "notebook", "run", "compare", "present"])
def test_no_horizontal_scroll_at_390px(site, browser, where: str) -> None:
    server, ids = site
    path = {"home": "/", "notebook": f"/notebooks/{ids['long']}", "run": f"/runs/{ids['run']}",
            "compare": f"/compare?runs={ids['run']},{ids['reworded_run']}",
            "present": f"/runs/{ids['run']}/present/3"}[where]
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                   device_scale_factor=2, bypass_csp=True)
    page = context.new_page()
    page.goto(server.url + path)
    if where == "run":
        expect(page.locator("#hm-status")).to_contain_text("all layers", timeout=10_000)
    widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth, "
                           "window.innerWidth]")
    shot(page, f"34-390px-{where}")
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e => {
        const r = e.getBoundingClientRect();
        return r.width && r.right > window.innerWidth + 1
               && !e.closest('.table-wrap, .aligned-wrap, .tokens, .snapshot-doc, .head-grid, .menu-list');
      }).slice(0, 5)
        .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
    context.close()
    assert widths[0] <= 390, (widths, wide)


@pytest.mark.parametrize("where", ["home", "notebook", "run", "compare", "present-light",
                                   "present-dark", "present-map-dark", "report"])
def test_text_contrast_meets_wcag_aa(site, browser, where: str) -> None:
    server, ids = site
    path = {"home": "/", "notebook": f"/notebooks/{ids['long']}", "run": f"/runs/{ids['run']}",
            "compare": f"/compare?runs={ids['run']},{ids['reworded_run']}",
            "present-light": f"/runs/{ids['run']}/present/3",
            "present-dark": f"/runs/{ids['run']}/present/3",
            "present-map-dark": f"/runs/{ids['run']}/present/4",  # the notes map on a dark slide
            "report": f"/runs/{ids['run']}/report.html"}[where]
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True,
                                   color_scheme="dark" if where.endswith("-dark") else "light")
    page = context.new_page()
    page.goto(server.url + path)
    if where == "run":
        expect(page.locator("#hm-status")).to_contain_text("all layers", timeout=10_000)
    audit = page.evaluate(CONTRAST_AUDIT)
    if where.endswith("-dark"):
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(16, 20, 29)"
    context.close()
    assert audit["checked"] > 20 and audit["bad"] == [], audit


def test_a_missing_run_is_an_html_404_in_the_layout(site, page) -> None:
    server, _ = site
    response = page.goto(f"{server.url}/runs/987654")
    assert response.status == 404 and response.headers["content-type"].startswith("text/html")
    expect(page.locator("h1")).to_have_text("Not found")
    assert page.locator(".topbar").count() == 1 and "run 987654 not found" in page.inner_text("main")
    shot(page, "35-not-found")
