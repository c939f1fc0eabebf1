"""KVNOTES_STORE_SCOPE=user on a real served kvnotes with accounts required (issue 48): the run's
snapshot carries its user to a real worker, which keys the KV store's notes by that user. Alice's
second run of her document reads it from the store; Bob's run of the same document reads 0 stored
tokens, so `store_reuse` (the API, the page, export.json) tells Bob nothing of what Alice ran. A
notebook's delete page says the store keeps its document's notes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import ServedApp, kvnotes_cli, until

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"  # a byte tokenizer: one token per character
SECRET = "a store scope test secret key, long enough"
DOCUMENT = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\npin: 48213907\n\n"
            + "Only accounts whose status is active may log in. " * 20)


def _client(app: ServedApp, name: str) -> httpx.Client:
    added = kvnotes_cli("users", "add", name, "--password-stdin", env=app.env,
                        stdin=f"{name} long password\n")
    assert added.returncode == 0, added.stderr
    token = kvnotes_cli("tokens", "create", name, env=app.env).stdout.strip()
    return httpx.Client(base_url=f"{app.url}/api", headers={"Authorization": f"Bearer {token}"}, timeout=120)


def _run(client: httpx.Client) -> dict:
    """A notebook of DOCUMENT with one field, and one run of it, finished."""
    nb = client.post("/notebooks", json={"title": "record", "model": MODEL, "text": DOCUMENT})
    assert nb.status_code in (200, 201), nb.text
    start = DOCUMENT.index("active")
    field = client.post(f"/notebooks/{nb.json()['id']}/fields",
                        json={"start": start, "end": start + 6, "new_value": "suspended", "label": "status"})
    assert field.status_code in (200, 201), field.text
    run = client.post(f"/notebooks/{nb.json()['id']}/runs",
                      json={"question": "Can Dana log in?", "choices": ["yes", "no"],
                            "strategies": ["recompute", "erratum"]})
    assert run.status_code in (200, 201, 202), run.text

    def done():
        now = client.get(f"/runs/{run.json()['id']}").json()
        return now if now["status"] not in ("queued", "running") else None
    finished = until("the run", done, 300, 0.5)
    assert finished["status"] == "succeeded", finished["error"]
    return finished


def test_with_a_user_scope_another_users_run_reads_no_stored_notes(tmp_path: Path) -> None:
    with ServedApp(tmp_path, MODEL, worker=True, KVNOTES_AUTH="required", KVNOTES_SECRET_KEY=SECRET,
                   KVNOTES_STORE_SCOPE="user") as app:
        alice, bob = _client(app, "alice"), _client(app, "bob")
        first = _run(alice)
        assert first["store_reuse"]["tokens"] == 0
        again = _run(alice)  # her own document again: read from the store
        n_tokens = len(DOCUMENT)
        assert again["store_reuse"]["tokens"] >= 0.9 * n_tokens, again["store_reuse"]
        bobs = _run(bob)  # the same document, another user
        assert bobs["store_reuse"]["tokens"] == 0, bobs["store_reuse"]
        assert {n: r["decision"] for n, r in bobs["results"].items()} == \
            {n: r["decision"] for n, r in again["results"].items()}
        # deleting a notebook leaves its notes in the store: its delete page says so
        page = httpx.get(f"{app.url}/notebooks/{first['notebook_id']}/delete", timeout=60,
                         headers=alice.headers)
        assert page.status_code == 200 and "KV store keeps this document" in page.text
