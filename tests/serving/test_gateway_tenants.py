"""Tenants never meet (issue 39 item 2): `kvnotes gateway` as a real process in front of a recording
upstream (`tests.serving.engines.Engine`, a real HTTP server that keeps every request's body), and
two tenants whose system prompts differ only in a secret value. Before tenants, both had one base
(keyed by the shared key, or by the address when no key): B's request went upstream as A's text plus
"account_id has changed from <A's secret> to <B's>".
"""

from __future__ import annotations

import json

import httpx
import pytest

from serving.gateway.tenants import TenantRules
from tests.serving.engines import Engine, Gateway

LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))
SYSTEM = "You are the billing agent.\naccount_id: {}\nplan: business\n\n" + LOG
SECRETS = {"a": "ZephyrQuartz", "b": "MarbleOtter"}


@pytest.fixture(scope="module")
def engine():
    served = Engine("vllm", key="account_id")
    yield served
    served.close()


def _ask(gateway: Gateway, secret: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM.format(secret)},
                         {"role": "user", "content": "Which account is this?"}]}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def _exchange(engine: Engine, gateway: Gateway, headers: dict[str, dict[str, str]]) -> list[tuple]:
    """A, B, A, B, each tenant's value the same every time: (tenant, header, tenant kind, what the
    upstream received, the answer) per request."""
    out = []
    for who in "abab":
        before = len(engine.completions)
        answer = _ask(gateway, SECRETS[who], headers[who])
        assert answer.status_code == 200, answer.text
        assert len(engine.completions) == before + 1
        out.append((who, answer.headers["x-kvnotes-gateway"], answer.headers["x-kvnotes-tenant"],
                    json.dumps(engine.completions[-1]), answer.text))
    return out


def _never_meet(exchanged: list[tuple]) -> None:
    for who, _, _, sent, answer in exchanged:
        other = SECRETS["b" if who == "a" else "a"]
        assert other not in sent and other not in answer, (who, sent[:300])
        assert SECRETS[who] in answer  # the engine answered from the tenant's own prompt


@pytest.mark.parametrize("key", [None, "unused", "EMPTY", "sk-no-key-required"])
def test_no_key_or_a_shared_key_is_never_rewritten(tmp_path, engine, key):
    gateway = Gateway(tmp_path, f"{engine.url}/v1", "--check-rate", "0")
    try:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        exchanged = _exchange(engine, gateway, {"a": headers, "b": headers})
        _never_meet(exchanged)
        why = "no API key" if key is None else "a shared API key"
        assert {h for _, h, _, _, _ in exchanged} == {
            f"pass-through; reason=no tenant: {why} (the operator may opt in with --rewrite-shared)"}
        assert {kind for _, _, kind, _, _ in exchanged} == {"none"}
    finally:
        gateway.stop()


def test_distinct_keys_and_tenant_headers_keep_their_own_bases(tmp_path, engine):
    """Each tenant's own base serves it (a changed value is rewritten), never the other's."""
    gateway = Gateway(tmp_path / "keys", f"{engine.url}/v1", "--check-rate", "0",
                      "--shared-key", "team-key")
    by_header = Gateway(tmp_path / "header", f"{engine.url}/v1", "--check-rate", "0",
                        "--tenant-header", "X-Org")
    try:
        keys = {"a": {"Authorization": "Bearer sk-tenant-a"}, "b": {"Authorization": "Bearer sk-tenant-b"}}
        exchanged = _exchange(engine, gateway, keys)
        _never_meet(exchanged)
        assert [h for _, h, _, _, _ in exchanged] == ["pass-through; reason=new base"] * 2 + ["erratum"] * 2
        assert {kind for _, _, kind, _, _ in exchanged} == {"key"}
        # a later value of A's is A's base plus an erratum from A's own old value
        rewritten = _ask(gateway, "QuietHarbor", keys["a"])
        assert rewritten.headers["x-kvnotes-gateway"] == "erratum"
        sent = json.dumps(engine.completions[-1])
        assert SECRETS["a"] in sent and SECRETS["b"] not in sent
        declared = _ask(gateway, SECRETS["b"], {"Authorization": "Bearer team-key"})
        assert declared.headers["x-kvnotes-tenant"] == "none"  # declared shared by --shared-key
        # one shared key, two tenants told apart by the proxy's header
        orgs = {"a": {"Authorization": "Bearer unused", "X-Org": "org-a"},
                "b": {"Authorization": "Bearer unused", "X-Org": "org-b"}}
        exchanged = _exchange(engine, by_header, orgs)
        _never_meet(exchanged)
        assert [h for _, h, _, _, _ in exchanged] == ["pass-through; reason=new base"] * 2 + ["erratum"] * 2
        assert {kind for _, _, kind, _, _ in exchanged} == {"header"}
        missing = _ask(by_header, SECRETS["a"], {"Authorization": "Bearer sk-tenant-a"})
        assert missing.headers["x-kvnotes-gateway"].startswith(
            "pass-through; reason=no tenant: no x-org header")
    finally:
        gateway.stop()
        by_header.stop()


def test_rewrite_shared_is_an_opt_in_that_says_so(tmp_path, engine):
    """Under --rewrite-shared, keyless requests are one tenant, "shared": B's request is A's base plus
    an erratum (what the operator opted into), and the header says whose."""
    gateway = Gateway(tmp_path, f"{engine.url}/v1", "--check-rate", "0", "--rewrite-shared")
    try:
        first, second = _ask(gateway, SECRETS["a"], {}), _ask(gateway, SECRETS["b"], {})
        assert first.headers["x-kvnotes-gateway"] == "pass-through; reason=new base"
        assert second.headers["x-kvnotes-gateway"] == "erratum"
        assert second.headers["x-kvnotes-tenant"] == "shared"
        assert SECRETS["a"] in json.dumps(engine.completions[-1])
    finally:
        gateway.stop()


def test_tenant_rules():
    rules = TenantRules.of(shared_keys=["team-key", " "])
    assert rules.identify("ops", {}).kind == "user"
    assert rules.identify(None, {"authorization": "Bearer sk-1"}) != rules.identify(
        None, {"authorization": "Bearer sk-2"})
    assert "sk-1" not in rules.identify(None, {"authorization": "Bearer sk-1"}).id  # only its hash
    for key in ("unused", "EMPTY", "team-key", ""):
        assert rules.identify(None, {"authorization": f"Bearer {key}"}).id == ""
    assert TenantRules.of(rewrite_shared=True).identify(None, {}).id == "shared"
