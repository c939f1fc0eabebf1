"""The protections in real headless Chromium, with the Content-Security-Policy in force: signing
in, the pages' forms and htmx edits working under the CSP (no violation reported), and a form on
another origin (another port of 127.0.0.1: same-site, so SameSite=Lax would still send the
cookie) refused with 403 and nothing saved."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
DOC = "Account record\n\nstatus: active\nowner: Dana Lee\n\nOnly accounts whose status is active may log in."

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")

from tests.conftest import kvnotes_env  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def app_url(tmp_path: Path):
    """uvicorn serving the app with sign-in required, and one editor `alice`."""
    env = {**os.environ, **kvnotes_env(tmp_path, KVNOTES_AUTH="required"), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "worker.cli", "users", "add", "alice", "--password-stdin"],
                   input="alice-password\n", env=env, cwd=REPO, check=True, capture_output=True, text=True)
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}", env
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


@pytest.fixture
def evil_url(tmp_path: Path):
    """Another origin on this machine serving one page: a form that posts to the app."""
    folder = tmp_path / "evil"
    folder.mkdir()
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(folder), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_sign_in_edits_under_the_csp_and_a_cross_site_form_is_refused(app_url, evil_url) -> None:
    url, env = app_url
    folder, evil = evil_url
    violations: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda exc: violations.append(str(exc)))

        page.goto(url + "/")
        assert "/login" in page.url
        page.fill("#login-name", "alice")
        page.fill("#login-password", "alice-password")
        page.click("form[action=\"/login\"] button[type=submit]")
        page.wait_for_selector("text=alice · editor")

        page.fill("#nb-title", "Policy")
        page.fill("#nb-text", DOC)
        page.click("text=Create notebook")
        page.wait_for_url("**/notebooks/*")
        notebook_url = page.url
        page.fill("#new-erratum", "Note: the owner changed.")  # an htmx form
        page.locator("#errata-panel form").last.locator("button[type=submit]").click()
        page.wait_for_selector("text=Note: the owner changed.")

        (folder / "index.html").write_text(
            f'<form method="post" action="{url}/notebooks"><input name="title" value="pwned">'
            f'<input name="model" value="smollm2-135m"><input name="text" value="evil">'
            f'<button type="submit">win a prize</button></form>')
        statuses: list[int] = []
        page.on("response", lambda r: statuses.append(r.status) if r.url == f"{url}/notebooks" else None)
        page.goto(evil + "/index.html")
        page.click("text=win a prize")
        page.wait_for_load_state()
        assert statuses == [403]
        page.goto(url + "/")
        assert "pwned" not in page.content()
        page.goto(notebook_url)
        page.click("text=Sign out")
        page.wait_for_url("**/login")
        browser.close()
    assert violations == []
