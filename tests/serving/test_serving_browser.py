"""The Serving panel in headless Chromium, with the app's Content-Security-Policy in force: it loads
into the notebook page, a replay started from its form shows progress, and the finished panel
shows the numbers the API stores."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import CHROMIUM, CHROMIUM_ARGS, chromium
from tests.serving.conftest import make_notebook

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_a_replay_from_the_panel_shows_the_stored_numbers(served):
    sync_api = chromium()
    with httpx.Client(base_url=served.url, timeout=120) as client:
        nid = make_notebook(client)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{served.url}/notebooks/{nid}")
        page.wait_for_selector("#serving-form")  # loaded into place by htmx
        assert page.input_value("#serving-url").endswith("/v1")  # KVNOTES_VLLM_URL
        page.fill("#serving-values", "Madrid\nRome")
        page.fill("#serving-form input[name=rate]", "4")
        page.uncheck("#serving-form input[value=hoist]")
        page.click("#serving-form button[type=submit]")
        page.wait_for_selector("#replay-box")
        page.wait_for_selector("#replay-box .badge.succeeded, #replay-box .badge.failed", timeout=600_000)
        assert page.locator("#replay-box .badge.succeeded").count() == 1, page.inner_text("#replay-box")
        assert page.locator("#replay-box[hx-trigger]").count() == 0  # polling stopped
        with httpx.Client(base_url=served.url, timeout=60) as client:
            stored = client.get(f"/api/notebooks/{nid}/replays").json()[0]["result"]["variants"]
        assert list(stored) == ["in_place", "erratum"]
        for name, v in stored.items():
            row = page.locator(f'#replay-box tr[data-variant="{name}"]')
            shown = row.locator('[data-metric="prefix_hit_rate"]').inner_text()
            assert shown == f"{v['prefix_hit_rate'] * 100:.1f}%"
        assert page.locator(".ttft-strips circle").count() == 4  # one dot per request
        page.click("#replay-box a[href^='/replays/']")
        page.wait_for_selector("h1:has-text('Serving replay')")
        assert not errors, errors
        browser.close()
