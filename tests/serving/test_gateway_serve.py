"""The gateway mounted at `/gateway/v1` under the web app, behind its accounts and tokens, in template
mode: a notebook's document with its field as a slot, named by the field's label in the erratum; the
Gateway page lists the base, and the template's notebook links to it. The upstream is a real HTTP
peer speaking vLLM's API (`tests.serving.engines`)."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.conftest import ServedApp
from tests.serving.conftest import DOCUMENT, QUESTION
from tests.serving.engines import Engine
from vocabulary import render_erratum

LABEL = "port of discharge"


@pytest.fixture
def engine():
    served = Engine("vllm")
    yield served
    served.close()


def _token(app: ServedApp) -> str:
    from data.accounts import add_user, create_token

    with app.db() as session:
        add_user(session, "ops", "ops-password-long", "editor")
        token = create_token(session, "ops")[1]
        session.commit()
    return token


def test_template_mode_under_serve_behind_tokens(tmp_path, engine):
    with ServedApp(tmp_path, "tiny-llama", KVNOTES_AUTH="required",
                   KVNOTES_GATEWAY_UPSTREAM=f"{engine.url}/v1", KVNOTES_GATEWAY_NOTEBOOK="1",
                   KVNOTES_GATEWAY_CHECK_RATE="0") as app:
        token = _token(app)
        web = httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {token}"})
        start = DOCUMENT.index("Oslo")
        created = web.post("/api/notebooks", json={"title": "shipment", "model": "tiny-llama",
                                                   "text": DOCUMENT})
        assert created.status_code == 201 and created.json()["id"] == 1, created.text
        field = web.post("/api/notebooks/1/fields", json={"start": start, "end": start + 4,
                                                           "new_value": "Madrid", "label": LABEL})
        assert field.status_code == 201, field.text

        anonymous = httpx.post(f"{app.url}/gateway/v1/chat/completions", json={"model": "m", "messages": []})
        assert anonymous.status_code == 401  # the same accounts and tokens as the API
        client = openai.OpenAI(base_url=f"{app.url}/gateway/v1", api_key=token, max_retries=0)

        def ask(city: str):
            return client.chat.completions.with_raw_response.create(
                model="smollm2-135m", max_tokens=8, temperature=0, messages=[
                    {"role": "system",
                     "content": "You answer from the record.\n" + DOCUMENT.replace("Oslo", city)},
                    {"role": "user", "content": QUESTION}])

        assert ask("Oslo").headers["x-kvnotes-gateway"] == "pass-through; reason=new base"
        rewritten = ask("Rome")
        assert rewritten.headers["x-kvnotes-gateway"] == "erratum"
        sent = engine.completions[-1]["messages"][0]["content"]
        assert sent == "You answer from the record.\n" + DOCUMENT + render_erratum(LABEL, "Oslo", "Rome")
        other = DOCUMENT.replace("Oslo", "Lisbon").replace("NordFreight", "SeaLine")  # outside the slot
        outside = client.chat.completions.with_raw_response.create(
            model="smollm2-135m", max_tokens=8, messages=[{"role": "system", "content": other},
                                                           {"role": "user", "content": QUESTION}])
        assert outside.headers["x-kvnotes-gateway"] == ("pass-through; reason=the notebook's document is "
                                                        "not in the prompt")
        page = web.get("/gateway")
        assert page.status_code == 200
        assert LABEL in page.text and "/notebooks/1" in page.text and "erratum" in page.text
        bases = web.get("/gateway/bases").text
        assert 'hx-trigger="every 2s"' in bases
        assert "<td>3</td><td>1</td><td>2</td>" in bases  # requests, rewrites, pass-throughs
        # the upstream, in rotation, with this process's 3 requests to it (issue 50)
        assert 'id="gateway-upstreams"' in bases and f"<code>{engine.url}" in bases
        assert "<td>in</td>" in bases and "<td>3</td>" in bases.split('id="gateway-upstreams"')[1]
        assert "for 0 sampled checks" in bases and "Prompt tokens sent for clients" in bases  # their cost
        words = " ".join(page.text.replace("&#39;", "'").split())
        assert "State: this web process's memory" in words
        assert "a base serves only the user (or API token's user) that made it, and this page lists only " \
               "your own" in words
        assert "each user's requests carry a <code>cache_salt</code> of their own" in words
        assert 'href="/gateway"' in web.get("/notebooks/1/serving").text
        metrics = web.get("/gateway/metrics").text
        assert "kvnotes_gateway_rewrites_total 1.0" in metrics


ALICE_LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking."
                      for i in range(30))


def test_each_user_sees_only_their_own_bases(tmp_path, engine):
    """Issue 48 item 3: under `serve`, the Gateway page lists the signed-in user's own bases (their
    field labels are text from their prompts), beside totals for everyone; bob's page names none of
    alice's fields, nor her base, and a viewer's page lists none of either."""
    from data.accounts import add_user, create_token

    with ServedApp(tmp_path, "tiny-llama", KVNOTES_AUTH="required",
                   KVNOTES_GATEWAY_UPSTREAM=f"{engine.url}/v1", KVNOTES_GATEWAY_CHECK_RATE="0") as app:
        with app.db() as session:
            for name, role in (("alice", "editor"), ("bob", "editor"), ("carol", "viewer")):
                add_user(session, name, f"{name}-password-long", role)
            tokens = {name: create_token(session, name)[1] for name in ("alice", "bob", "carol")}
            session.commit()
        web = {name: httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {token}"})
               for name, token in tokens.items()}

        def ask(who: str, line: str):
            answer = web[who].post("/gateway/v1/chat/completions", json={
                "model": "smollm2-135m", "max_tokens": 8, "temperature": 0, "messages": [
                    {"role": "system", "content": f"You are the agent.\n{line}\n\n{ALICE_LOG}"},
                    {"role": "user", "content": "What is the status?"}]})
            assert answer.status_code == 200, answer.text
            return answer.headers["x-kvnotes-gateway"]

        assert ask("alice", "owner ZQXALPHA93817 status: active") == "pass-through; reason=new base"
        assert ask("alice", "owner ZQXALPHA93817 status: suspended") == "erratum"
        assert ask("bob", "ticket BRAVO55102 state: open") == "pass-through; reason=new base"
        assert ask("bob", "ticket BRAVO55102 state: closed") == "erratum"
        pages = {who: web[who].get("/gateway").text + web[who].get("/gateway/bases").text for who in web}
        assert "owner ZQXALPHA93817 status" in pages["alice"] and "BRAVO55102" not in pages["alice"]
        assert "ticket BRAVO55102 state" in pages["bob"] and "ZQXALPHA93817" not in pages["bob"]
        assert "ZQXALPHA93817" not in pages["carol"] and "BRAVO55102" not in pages["carol"]
        assert "No base of yours yet" in pages["carol"]
        bases = {who: set(re.findall(r"<td><code>([0-9a-f]+)</code>", pages[who])) for who in web}
        assert len(bases["alice"]) == len(bases["bob"]) == 1 and not bases["alice"] & bases["bob"]
        for who in web:  # the totals are everyone's: 4 requests, 2 rewritten, 2 bases of 2 tenants
            assert "In all, every user: 4 requests, 2 rewritten; 2 bases of 2 tenants" in " ".join(
                pages[who].split()), who


def test_one_users_slow_gateway_requests_leave_the_pages_to_everyone_else(tmp_path):
    """User B holds 24 gateway requests to an upstream that answers after 30 s (every one of B's
    slots); user A's `GET /api/notebooks` answers 200 within 1 s all along, and B's 25th request is
    429 at once (issue 49 item 4). Before, B's requests took the web app's slots (the database pool's
    size) and its waiting line: A got 503 after 15 s."""
    import threading
    import time

    slow = Engine("vllm", fault="slow", delay_s=30)
    try:
        with ServedApp(tmp_path, "tiny-llama", KVNOTES_AUTH="required",
                       KVNOTES_GATEWAY_UPSTREAM=f"{slow.url}/v1", KVNOTES_GATEWAY_CHECK_RATE="0",
                       KVNOTES_GATEWAY_TIMEOUT="60", KVNOTES_GATEWAY_SLOTS_PER_USER="24") as app:
            from data.accounts import add_user, create_token

            with app.db() as session:
                tokens = {}
                for name in ("user-a", "user-b"):
                    add_user(session, name, "a-long-password", "editor")
                    tokens[name] = create_token(session, name)[1]
                session.commit()
            body = {"model": "smollm2-135m", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Where is the shipment going?"}]}
            held: list[int] = []

            def hold() -> None:
                answer = httpx.post(f"{app.url}/gateway/v1/chat/completions", json=body, timeout=90,
                                    headers={"Authorization": f"Bearer {tokens['user-b']}"})
                held.append(answer.status_code if answer.status_code == 200 else answer.text)

            threads = [threading.Thread(target=hold) for _ in range(24)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 60
            while len(slow.completions) < 24:  # all 24 at the upstream, waiting for its answer
                assert time.monotonic() < deadline and not held, (len(slow.completions), held)
                time.sleep(0.05)
            over = httpx.post(f"{app.url}/gateway/v1/chat/completions", json=body, timeout=10,
                              headers={"Authorization": f"Bearer {tokens['user-b']}"})
            assert over.status_code == 429, over.text
            assert over.headers["retry-after"] == "2" and "KVNOTES_GATEWAY_SLOTS_PER_USER" in over.text
            web = httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {tokens['user-a']}"})
            took = []
            for _ in range(10):
                start = time.monotonic()
                answer = web.get("/api/notebooks", timeout=20)
                took.append(time.monotonic() - start)
                assert answer.status_code == 200, answer.text
                time.sleep(0.3)
            assert max(took) < 1.0, took
            assert len(held) == 0  # B's requests were held all along
            for thread in threads:
                thread.join(90)
            assert held == [200] * 24
    finally:
        slow.close()
