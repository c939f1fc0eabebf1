"""The run page in Chromium: attention by region above the heatmap (its per-layer plots drawn),
verdicts that lead with the edit, the panels painted with the server's colours, and "most
attended" listing words unless the toggle asks for the sink, whitespace and punctuation too."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServedApp
from tests.web.conftest import ARTIFACTS, long_record_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_regions_verdicts_and_words_first(tmp_path: Path, browser_page) -> None:
    page, errors = browser_page
    server = ServedApp(tmp_path, "smollm2-135m")
    try:
        from data.models import RunResult

        with server.db() as s:
            run_id = long_record_run(s, ("recompute", "stale", "in_place", "field_erratum")).id
            for result in s.query(RunResult).filter_by(run_id=run_id):  # the sink's last token draws the most
                w = (np.frombuffer(result.attention, dtype=np.float16)
                     .reshape(result.attention_shape).astype(np.float32))
                w[:, :, 3] += 1.0
                result.attention = (w / w.sum(-1, keepdims=True)).astype(np.float16).tobytes()
            s.commit()
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_function("document.querySelectorAll('#hm-top tbody tr').length === 10")
        assert "2 of 3 strategies follow the edit, as recompute does" in page.inner_text(".run-headline")
        assert "✗ keeps the old value" in page.inner_text('.decision-table tr[data-strategy="stale"]')
        # regions: a row per strategy and the paper's, four per-layer plots with 4 layers of columns
        page.wait_for_selector("#regions .region-table")  # loaded after the page opens
        assert page.locator("#regions .region-table tbody tr").count() == 5
        assert page.locator("#regions svg").count() == 4
        assert page.locator("#regions svg >> nth=0").bounding_box()["width"] == 56
        page.locator("#regions").screenshot(path=str(ARTIFACTS / "regions-panel.png"))
        page.locator(".decision-table").screenshot(path=str(ARTIFACTS / "verdicts-table.png"))
        # most attended: words only, then the sink, whitespace and punctuation on request
        words = page.locator("#hm-top tbody tr td:nth-child(2)").all_inner_texts()
        rows = [int(i) for i in page.eval_on_selector_all("#hm-top tbody tr",
                                                          "rs => rs.map(r => r.dataset.i)")]
        assert all(re.search(r"\w", w) for w in words) and min(rows) >= 4, (words, rows)
        # the panels carry the server's colours (/runs/{id}/attention/paint), token for token
        strategy = page.input_value("#hm-strategy")
        paint = page.evaluate(f"fetch('/runs/{run_id}/attention/paint?strategy={strategy}')"
                              ".then(r => r.json())")
        for box, side in (("#hm-ref", "ref"), ("#hm-res", "res"), ("#hm-diff", "diff")):
            drawn = page.eval_on_selector_all(f"{box} .tok", "ts => ts.map(t => t.style.backgroundColor)")
            wanted = [f"rgb({int(c[1:3], 16)}, {int(c[3:5], 16)}, {int(c[5:7], 16)})"
                      for c in paint[side]["bg"]]
            assert drawn == wanted, box
        grid = page.eval_on_selector("#hm-grid button[data-head]", "b => b.style.background")
        assert grid.startswith("rgb("), grid
        page.check("#hm-top-all")
        # the sink first
        page.wait_for_function("document.querySelector('#hm-top tbody tr').dataset.i === '3'")
        assert page.inner_text("#hm-top tbody tr td:nth-child(2) >> nth=0") == '"Account"'
        assert not errors, errors
    finally:
        server.stop()
