"""The Serving panel in headless Chromium, with the app's Content-Security-Policy in force: it loads
into the notebook page, a replay started from its form shows progress, and the finished panel
shows the numbers the API stores; the same for the trajectory page's Replay on vLLM panel, turn by
turn."""

from __future__ import annotations

import httpx
import pytest

from tests.serving.conftest import RECORD, START, make_notebook, trajectory

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _opened(browser, url: str, form: str):
    """A new page at `url` once htmx has loaded `form` into place, and the page errors it collects."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_selector(form)
    return page, errors


def test_a_replay_from_the_panel_shows_the_stored_numbers(served, browser):
    with httpx.Client(base_url=served.url, timeout=120) as client:
        nid = make_notebook(client)
    page, errors = _opened(browser, f"{served.url}/notebooks/{nid}", "#serving-form")
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


def test_a_trajectory_replay_from_the_trajectory_page_shows_every_turn(served, browser):
    """The trajectory page's Replay on vLLM panel: loaded into place, started from its form, then
    every turn's hit rate as the API stores it and a point per turn and variant in its figure."""
    with httpx.Client(base_url=served.url, timeout=120) as client:
        nid = client.post("/api/notebooks", json={"title": "shipment", "model": "tiny-llama",
                                                  "text": RECORD}).json()["id"]
        client.post(f"/api/notebooks/{nid}/fields", json={"start": START, "end": START + 4,
                                                          "new_value": "Madrid", "label": "destination"})
        turns = [{"append": t.append, **({"fields": t.fields} if t.fields else {})}
                 for t in trajectory(4).turns]
        tid = client.post(f"/api/notebooks/{nid}/trajectories",
                          json={"turns": turns, "question": "Where does it go?",
                                "choices": ["Oslo", "Madrid"], "strategies": ["erratum"]}).json()["id"]
        client.post(f"/api/trajectories/{tid}/cancel")
    page, errors = _opened(browser, f"{served.url}/trajectories/{tid}", "#trajectory-serving-form")
    assert page.input_value("#trajectory-serving-url").endswith("/v1")  # KVNOTES_VLLM_URL
    page.uncheck("#trajectory-serving-form input[value=hoist]")
    page.click("#trajectory-serving-form button[type=submit]")
    page.wait_for_selector("#replay-box .badge.succeeded, #replay-box .badge.failed", timeout=600_000)
    assert page.locator("#replay-box .badge.succeeded").count() == 1, page.inner_text("#replay-box")
    with httpx.Client(base_url=served.url, timeout=60) as client:
        stored = client.get(f"/api/trajectories/{tid}/replays").json()[0]["result"]["variants"]
    assert list(stored) == ["in_place", "erratum"]
    for name, v in stored.items():
        for t in v["turns"]:
            cell = page.locator(f'#replay-box tr[data-turn="{t["index"] + 1}"] '
                                f'td[data-variant="{name}"][data-metric="hit_rate"]')
            assert cell.inner_text() == f"{t['hit_rate'] * 100:.0f}%", (name, t)
    figure = page.locator('svg[aria-label="Prefix-cache hit rate per turn"] circle')
    assert figure.count() == 2 * 4  # a point per variant and turn
    assert not errors, errors
