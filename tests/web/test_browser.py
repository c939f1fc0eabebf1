"""The notebook in real headless Chromium (Debian's `chromium`, driven by the Python `playwright`
package), against the real app started with uvicorn on a free port and a temporary data folder.

`test_notebook_editing_in_the_browser` needs no worker: notebook from the form, a field made by
selecting a span with the mouse, an erratum, a compiled skill dragged in (the skill row is written
to the database, as a worker would), a finished run's decision table and heatmap.
`test_run_with_a_real_worker_on_tiny_llama` also starts a real Celery worker serving `tiny-llama`
and runs three strategies end to end. Screenshots of every step go to `test-artifacts/`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import ServedApp
from tests.web.conftest import ARTIFACTS, long_record_run
from tests.web.conftest import BROWSER_DOC as DOC

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def select_with_mouse(page, text: str) -> None:
    """Drag the mouse across the first occurrence of `text` in the document."""
    box = page.evaluate(
        """(needle) => {
          for (const t of document.querySelectorAll('#document .t')) {
            const node = t.firstChild, at = node ? node.data.indexOf(needle) : -1;
            if (at < 0) continue;
            const r = document.createRange(); r.setStart(node, at); r.setEnd(node, at + needle.length);
            const b = r.getBoundingClientRect(); return {x: b.left, y: b.top + b.height / 2, w: b.width};
          }
          return null;
        }""",
        text,
    )
    assert box, f"{text!r} not in the document"
    page.mouse.move(box["x"] + 1, box["y"])
    page.mouse.down()
    page.mouse.move(box["x"] + box["w"] / 2, box["y"], steps=4)
    page.mouse.move(box["x"] + box["w"] - 1, box["y"], steps=4)
    page.mouse.up()


def create_notebook(page, url: str, title: str) -> None:
    page.goto(url + "/")
    page.fill("#nb-title", title)
    page.fill("#nb-text", DOC)
    shot(page, "01-new-notebook")
    page.click("text=Create notebook")
    page.wait_for_url("**/notebooks/*")


def make_field_and_erratum(page) -> None:
    select_with_mouse(page, "active")
    page.wait_for_selector("#selection-form:not([hidden])")
    assert page.inner_text("#selection-form [data-quote]") == "active"
    page.fill("#sel-label", "status")
    page.fill("#sel-new", "suspended")
    shot(page, "02-selection-form")
    page.click("#selection-form button[type=submit]")
    page.wait_for_selector("#document .field-chip")
    assert page.inner_text("#document .field-chip .old") == "active"
    assert page.inner_text("#document .field-chip .new") == "suspended"
    assert ("status has changed from active to suspended"
            in page.input_value("#errata-panel li textarea >> nth=0"))
    page.fill("#new-erratum", "[NOTE] Dana Lee's plan is unchanged.")
    page.click("#errata-panel >> text=Add erratum")
    page.wait_for_selector("#errata-panel >> text=custom")
    shot(page, "03-field-and-errata")


def drag_skill_in(page) -> None:
    page.evaluate("window.scrollTo(0, 0)")  # the palette and the document's end both in view
    source = page.locator(".palette-skill").bounding_box()
    page.mouse.move(source["x"] + 20, source["y"] + 10)
    page.mouse.down()
    page.mouse.move(source["x"] + 40, source["y"] + 30, steps=5)  # dragstart: the drop zones open
    page.wait_for_function("document.body.classList.contains('dragging-skill')")
    page.wait_for_timeout(300)  # the zones' opening transition
    target = page.locator("#document .dropzone.end").bounding_box()
    page.mouse.move(target["x"] + target["width"] / 2, target["y"] + target["height"] / 2, steps=10)
    shot(page, "04-dragging-a-skill")
    page.mouse.up()
    page.wait_for_selector("#document .placement")
    assert "one word" in page.inner_text("#document .placement")
    assert "at the end" in page.inner_text("#document .placement")
    shot(page, "04-skill-dragged-in")


def test_notebook_editing_in_the_browser(tmp_path: Path, browser_page) -> None:
    page, errors = browser_page
    server = ServedApp(tmp_path, "smollm2-135m")
    try:
        from data.models import Notebook, Question, Skill

        create_notebook(page, server.url, "Browser test")
        assert page.evaluate("window.pwned") is None  # the <script> in the document is text
        assert "<script>window.pwned = 1</script>" in page.inner_text("#document")
        with server.db() as s:
            s.add(Skill(name="one word", text="Answer with one word.", model="smollm2-135m",
                        status="compiled", token_count=7, compile_ms=80.0))  # fmt: skip
            s.commit()
        page.reload()
        choices_example = page.get_attribute("#q-choices", "placeholder")  # a new notebook, no field
        assert choices_example.startswith("e.g. "), choices_example  # reads as an example, not a value
        make_field_and_erratum(page)
        drag_skill_in(page)
        # keyboard alternative: Enter on the palette skill, ↑ to the paragraph before, Enter
        page.focus(".palette-skill")
        page.keyboard.press("Enter")
        page.keyboard.press("ArrowUp")
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelectorAll('#document .placement').length === 2")
        # a finished run (rows as a worker writes them), its decision table and heatmap
        sys.path.insert(0, str(Path(__file__).parent))
        from tests.web.finished_run import finished_run

        with server.db() as s:
            nb = s.query(Notebook).one()
            nb.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
            s.commit()
            run_id, nb_id = finished_run(s, nb).id, nb.id
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_function("document.querySelectorAll('#hm-diff .tok').length > 10")
        assert page.locator(".decision-table tr.disagrees").count() == 1
        page.hover("#hm-res .tok >> nth=5")
        assert "recompute" in page.inner_text("#token-tip")
        page.click("#hm-grid button[data-layer='1'][data-head='2']")
        page.wait_for_function(
            "document.getElementById('hm-status').textContent.startsWith('layer 1, head 2')")
        shot(page, "05-finished-run")
        page.goto(f"{server.url}/notebooks/{nb_id}")
        assert page.get_attribute("#q-choices", "placeholder") == choices_example  # same with a field
        page.hover("#document .t >> nth=0")
        shot(page, "06-notebook-after-run")
        assert not errors, errors
    finally:
        server.stop()


def _worker_ready() -> str | None:
    for module in ("torch", "transformers", "celery", "worker.engine.engine", "worker.tasks"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not importable here"
    return None


def test_run_with_a_real_worker_on_tiny_llama(tmp_path: Path, browser_page) -> None:
    reason = _worker_ready()
    if reason:
        pytest.skip(f"needs a real worker: {reason}")
    page, errors = browser_page
    server = ServedApp(tmp_path, "tiny-llama", worker=True)
    try:
        # a skill written and compiled through the library page, by the worker
        page.goto(server.url + "/skills")
        page.fill("#sk-name", "one word")
        page.fill("#sk-text", "Answer with one word.")
        page.click("text=Save & compile")
        page.wait_for_selector("#skills-table-ok, .badge.compiled, .badge.failed", timeout=120_000)
        shot(page, "10-skill-compiled")
        assert page.locator(".badge.compiled").count() == 1, page.inner_text("main")

        create_notebook(page, server.url, "Worker test")
        make_field_and_erratum(page)
        drag_skill_in(page)
        page.fill("#q-text", "What is the account status?")
        page.fill("#q-choices", "active\nsuspended")
        for name in ("prefix_reuse", "in_place", "erratum", "selective", "auto"):
            page.uncheck(f"#run-form input[value={name}]")
        page.check("#run-form input[value=stale]")
        page.check("#run-form input[value=field_erratum]")
        page.click("#run-form button[type=submit]")
        page.wait_for_selector("#run-progress .progress-box")
        shot(page, "11-run-progress")
        page.wait_for_selector("#run-progress .badge.succeeded, #run-progress .badge.failed", timeout=300_000)
        shot(page, "12-run-finished")
        assert page.locator("#run-progress .badge.succeeded").count() == 1, page.inner_text("#run-progress")
        assert page.locator("#run-progress[hx-trigger]").count() == 0  # polling stopped
        page.click("text=See the decision diff")
        rows = page.locator(".decision-table tbody tr")
        assert rows.count() == 3
        assert ([rows.nth(i).locator(".strategy").inner_text() for i in range(3)]
                == ["recompute", "stale", "field_erratum"])
        page.wait_for_function("document.querySelectorAll('#hm-res .tok').length > 10", timeout=30_000)
        page.hover("#hm-res .tok >> nth=3")
        assert "recompute" in page.inner_text("#token-tip")
        shot(page, "13-decision-diff-and-heatmap")
        assert not errors, errors
    finally:
        server.stop()




def test_run_page_opens_on_the_difference_and_reads_from_any_token(tmp_path: Path, browser_page) -> None:
    """The heatmap opens on the strategy that differs, the legend is on the page, a question token
    becomes the query, the panels scroll together, the notes map is drawn over the text, and a free
    answer that differs only in case and punctuation reads as the same decision."""
    page, errors = browser_page
    server = ServedApp(tmp_path, "smollm2-135m")
    try:
        from data.models import RunResult

        with server.db() as s:
            run = long_record_run(s, ("recompute", "prefix_reuse", "stale", "field_erratum"), notes_map=True)
            free = s.query(RunResult).filter_by(run_id=run.id, strategy="field_erratum").one()
            free.decision = "the status is SUSPENDED"  # the engine's normalised match said: same answer
            s.commit()
            run_id = run.id
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_function("document.querySelectorAll('#hm-diff .tok').length > 100")
        # differs from recompute, not the exact prefix_reuse
        assert page.input_value("#hm-strategy") == "stale"
        # the script reads the reference and the segments it marks from the page, not from its source
        assert page.get_attribute("#attention", "data-reference") == "recompute"
        page.wait_for_function("document.querySelectorAll('#hm-overview .mark.question').length === 1")
        assert page.locator(".column-legend dt").count() >= 6 and page.is_visible(".column-legend")
        row = page.locator('.decision-table tr[data-strategy="field_erratum"]')
        assert "✓ follows the edit" in row.inner_text() and "SUSPENDED" in row.inner_text()
        # the notes map: one coloured span per stretch of notes after the field, the share in words
        assert page.locator("#notes-map .map-span").count() > 5
        assert "closed 94%" in page.inner_text("#notes-map .map-summary")
        # the three panels scroll together
        page.eval_on_selector("#hm-res", "e => { e.scrollTop = (e.scrollHeight - e.clientHeight) / 2; }")
        page.wait_for_timeout(200)
        ratios = page.evaluate("""['hm-ref', 'hm-res', 'hm-diff'].map(id => {
            const e = document.getElementById(id);
            return e.scrollTop / (e.scrollHeight - e.clientHeight); })""")
        assert all(abs(r - 0.5) < 0.05 for r in ratios), ratios
        # a question token becomes the query: its attention is drawn and the grid says per-head is
        # for the decision
        before = page.inner_text("#hm-status")
        page.click("#hm-res .tok.seg-question >> nth=1")
        page.wait_for_function("document.getElementById('hm-status').textContent"
                               ".startsWith('query=1 ')")
        assert before != page.inner_text("#hm-status")
        assert page.locator("#hm-res .tok.query").count() == 1
        assert page.input_value("#hm-query") == "1"
        assert "decision only" in page.inner_text("#hm-pick")
        page.select_option("#hm-query", "")
        page.wait_for_function("document.getElementById('hm-status').textContent.startsWith('all layers')")
        shot(page, "07-run-page-verdicts")
        assert not errors, errors
    finally:
        server.stop()
