"""Tenants that are proven (issue 48 item 1) and never meet (issue 39 item 2): `kvnotes gateway` as a
real process in front of a recording upstream (`tests.serving.engines.Engine`, a real HTTP server
that keeps every request's body), and two tenants whose system prompts differ only in a secret.

Before issue 48 a key was never checked: an unlisted key (the twelve placeholders below, or a
guessed one) got 200 and its request reached the upstream; the tenant header was taken from any
address; `--host 0.0.0.0` started with no way to tell tenants apart; and no request carried a cache
salt, so the engine's prefix cache answered one tenant from another's prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from serving.gateway.tenants import KeyFile, Refused, TenantRules, add_key, parse_keys
from tests.conftest import REPO, kvnotes_env
from tests.serving.engines import Engine, Gateway

LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))
SYSTEM = "You are the billing agent.\naccount_id: {}\nplan: business\n\n" + LOG
SECRETS = {"a": "ZephyrQuartz", "b": "MarbleOtter"}
# the placeholders of issue 48 that a deny-list missed: each an unlisted key like any other
PLACEHOLDERS = ["token-abc123", "ollama", "lm-studio", "sk-1234", "fake-key", "test", "sk-xxxx", "no_key",
                "NA", "n/a", "abc123", "secret"]


@pytest.fixture(scope="module")
def engine():
    served = Engine("vllm", key="account_id")
    yield served
    served.close()


@pytest.fixture
def keys(tmp_path):
    """A key file with tenants alice and bob: (its path, {tenant letter: key})."""
    path = tmp_path / "gateway-keys"
    return path, {"a": add_key(path, "alice"), "b": add_key(path, "bob")}


def _ask(gateway: Gateway, secret: str, headers: dict[str, str] | list, path: str = "chat/completions",
         **extra) -> httpx.Response:
    body = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0, **extra,
            "messages": [{"role": "system", "content": SYSTEM.format(secret)},
                         {"role": "user", "content": "Which account is this?"}]}
    return httpx.post(f"{gateway.url}/v1/{path}", json=body, headers=headers, timeout=30)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


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
                    engine.completions[-1], answer.text))
    return out


def _never_meet(exchanged: list[tuple]) -> None:
    for who, _, _, sent, answer in exchanged:
        other = SECRETS["b" if who == "a" else "a"]
        assert other not in json.dumps(sent) and other not in answer, (who, json.dumps(sent)[:300])
        assert SECRETS[who] in answer  # the engine answered from the tenant's own prompt


def _refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert words in error["message"], error["message"]


def test_an_unlisted_key_gets_401_and_the_upstream_receives_nothing(tmp_path, engine, keys):
    path, _ = keys
    gateway = Gateway(tmp_path / "g", f"{engine.url}/v1", "--check-rate", "0", "--keys", str(path))
    try:
        before = len(engine.completions)
        for key in [*PLACEHOLDERS, "sk-billing-agent"]:  # docs/gateway.md's old example key too
            answer = _ask(gateway, SECRETS["b"], _bearer(key))
            _refused(answer, 401, "the API key is not one of the gateway's keys")
            assert answer.json()["error"]["type"] == "authentication_error"
            assert answer.headers["www-authenticate"].startswith("Bearer")
        _refused(_ask(gateway, SECRETS["b"], {}), 401, "no API key")
        _refused(_ask(gateway, SECRETS["b"], _bearer("unused"), "completions", prompt="x"), 401, "not one of")
        _refused(httpx.get(f"{gateway.url}/v1/models", headers=_bearer("EMPTY")), 401, "not one of")
        assert len(engine.completions) == before  # nothing of theirs went upstream
    finally:
        gateway.stop()


def test_two_listed_tenants_never_meet_and_each_has_one_cache_salt(tmp_path, engine, keys):
    """A and B's prompts differ only in a secret: nothing sent upstream for one, and no answer it
    got, holds the other's; a changed value is rewritten on the tenant's own base; every request of a
    tenant, its sampled checks included, carries one cache_salt of its own, never its key."""
    path, key = keys
    gateway = Gateway(tmp_path / "g", f"{engine.url}/v1", "--check-rate", "1", "--keys", str(path))
    try:
        start = len(engine.completions)
        headers = {who: _bearer(key[who]) for who in "ab"}
        answers = [(who, _ask(gateway, SECRETS[who], headers[who])) for who in "abab"]
        assert [a.headers["x-kvnotes-gateway"] for _, a in answers] == (
            ["pass-through; reason=new base"] * 2 + ["erratum"] * 2)
        assert {a.headers["x-kvnotes-tenant"] for _, a in answers} == {"key"}
        rewritten = _ask(gateway, "QuietHarbor", headers["a"])  # A's base plus an erratum from A's value
        assert rewritten.headers["x-kvnotes-gateway"] == "erratum"
        answers.append(("a", rewritten))
        for who, answer in answers:
            other = SECRETS["b" if who == "a" else "a"]
            assert answer.status_code == 200 and other not in answer.text, answer.text
        deadline = time.monotonic() + 30  # the checks of the 3 greedy rewrites go in the background
        while len(engine.completions) < start + 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        sent = [json.dumps(b) for b in engine.completions[start:]]
        assert len(sent) == 8  # 5 clients' requests and 3 checks
        assert not [b for b in sent if SECRETS["a"] in b and SECRETS["b"] in b]  # none holds both
        assert [b for b in sent if f"from {SECRETS['a']} to QuietHarbor" in b]  # A's rewrite, on A's base
        salts = {who: {b["cache_salt"] for b in engine.completions[start:] if SECRETS[who] in json.dumps(b)}
                 for who in "ab"}
        assert [len(salts["a"]), len(salts["b"])] == [1, 1] and salts["a"] != salts["b"], salts
        assert all(key[who] not in s and s not in key[who] for who in "ab" for s in salts[who])
        assert all("cache_salt" in b for b in engine.completions[start:])  # the checks' too
        # a client's own cache_salt is replaced by its tenant's
        _ask(gateway, SECRETS["b"], headers["b"], cache_salt=next(iter(salts["a"])))
        assert engine.completions[-1]["cache_salt"] == next(iter(salts["b"]))
    finally:
        gateway.stop()


def test_the_key_file_is_read_again_when_it_changes(tmp_path, engine, keys):
    """Revoked without a restart: the key's line removed, its next request is 401; a key added by
    `kvnotes gateway keys add` works at once; a file made unreadable refuses everyone (503)."""
    path, key = keys
    gateway = Gateway(tmp_path / "g", f"{engine.url}/v1", "--check-rate", "0", "--keys", str(path))
    try:
        assert _ask(gateway, SECRETS["b"], _bearer(key["b"])).status_code == 200
        path.write_text("\n".join(line for line in path.read_text().splitlines() if "bob" not in line) + "\n")
        before = len(engine.completions)
        _refused(_ask(gateway, SECRETS["b"], _bearer(key["b"])), 401, "not one of the gateway's keys")
        assert len(engine.completions) == before
        added = subprocess.run([sys.executable, "-m", "commands.cli", "gateway", "keys", "add", "carol",
                                "--keys", str(path)], cwd=REPO, capture_output=True, text=True, timeout=60,
                               env={**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)})
        assert added.returncode == 0, added.stderr
        carol = added.stdout.strip()
        assert carol.startswith("kvn-") and len(carol) > 40 and carol not in path.read_text()
        assert _ask(gateway, SECRETS["b"], _bearer(carol)).status_code == 200
        path.write_text("carol sha256:nothex\n")
        _refused(_ask(gateway, SECRETS["a"], _bearer(key["a"])), 503, "line 1 is not 'TENANT sha256:HEX'")
    finally:
        gateway.stop()


def test_the_tenant_header_counts_only_from_trusted_proxies(tmp_path, engine):
    """`--tenant-header` from an address that is not a trusted proxy: 403 (and, without --keys, any
    request from it); from a trusted one it names the tenant; sent twice, or appended to: 400."""
    elsewhere = Gateway(tmp_path / "untrusted", f"{engine.url}/v1", "--check-rate", "0",
                        "--tenant-header", "X-Org", "--trusted-proxies", "10.0.0.0/8")
    trusted = Gateway(tmp_path / "trusted", f"{engine.url}/v1", "--check-rate", "0",
                      "--tenant-header", "X-Org", "--trusted-proxies", "192.0.2.1,127.0.0.1")
    try:
        before = len(engine.completions)
        _refused(_ask(elsewhere, SECRETS["a"], {"X-Org": "alice"}), 403, "trusted proxies")
        _refused(_ask(elsewhere, SECRETS["a"], {}), 403, "through its trusted proxies only")
        _refused(_ask(trusted, SECRETS["a"], [("X-Org", "mallory"), ("X-Org", "alice")]), 400, "set once")
        _refused(_ask(trusted, SECRETS["a"], {"X-Org": "mallory, alice"}), 400, "set once")
        assert len(engine.completions) == before
        orgs = {"a": {"X-Org": "org-a"}, "b": {"X-Org": "org-b"}}
        exchanged = _exchange(engine, trusted, orgs)
        _never_meet(exchanged)
        assert [h for _, h, _, _, _ in exchanged] == ["pass-through; reason=new base"] * 2 + ["erratum"] * 2
        assert {kind for _, _, kind, _, _ in exchanged} == {"header"}
        missing = _ask(trusted, SECRETS["a"], {})
        assert missing.headers["x-kvnotes-gateway"].startswith(
            "pass-through; reason=no tenant: no x-org header")
    finally:
        elsewhere.stop()
        trusted.stop()


def test_off_loopback_without_keys_the_gateway_does_not_start(tmp_path):
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)}
    for options in (["--host", "0.0.0.0"], ["--host", "0.0.0.0", "--tenant-header", "X-Org"]):
        ran = subprocess.run([sys.executable, "-m", "commands.cli", "gateway", "--upstream",
                              "http://127.0.0.1:9/v1", "--port", "1", *options], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 2, ran.stdout + ran.stderr
        assert len(ran.stderr.strip().splitlines()) == 1 and "--keys" in ran.stderr, ran.stderr


def test_on_loopback_without_keys_a_key_is_taken_as_sent(tmp_path, engine):
    """The single user's gateway: each key its own tenant (a placeholder too: no key is special), a
    request without one passed through (with the salt of no tenant) unless --rewrite-shared; with
    --cache-salt off nothing is salted, and a client's own salt goes as it came."""
    gateway = Gateway(tmp_path / "g", f"{engine.url}/v1", "--check-rate", "0")
    shared = Gateway(tmp_path / "s", f"{engine.url}/v1", "--check-rate", "0", "--rewrite-shared",
                     "--cache-salt", "off")
    try:
        exchanged = _exchange(engine, gateway, {"a": _bearer("EMPTY"), "b": _bearer("sk-tenant-b")})
        _never_meet(exchanged)
        assert [h for _, h, _, _, _ in exchanged] == ["pass-through; reason=new base"] * 2 + ["erratum"] * 2
        keyless = _ask(gateway, SECRETS["a"], {})
        assert keyless.headers["x-kvnotes-gateway"] == ("pass-through; reason=no tenant: no API key (the "
                                                         "operator may opt in with --rewrite-shared)")
        salts = [engine.completions[i].get("cache_salt") for i in range(-5, 0)]  # A, B, A, B, keyless
        assert None not in salts and len(set(salts)) == 3 and salts[0] == salts[2] != salts[1] == salts[3]
        first, second = _ask(shared, SECRETS["a"], {}), _ask(shared, SECRETS["b"], {})
        assert first.headers["x-kvnotes-gateway"] == "pass-through; reason=new base"
        assert second.headers["x-kvnotes-gateway"] == "erratum"  # what the operator opted into
        assert second.headers["x-kvnotes-tenant"] == "shared"
        assert "cache_salt" not in engine.completions[-1]
        _ask(shared, SECRETS["a"], {}, cache_salt="the-clients-own")
        assert engine.completions[-1]["cache_salt"] == "the-clients-own"
    finally:
        gateway.stop()
        shared.stop()


def test_tenant_rules(tmp_path):
    path = tmp_path / "keys"
    alice = add_key(path, "alice")
    path.write_text(path.read_text() + "\n# a comment\n   \n")
    rules = TenantRules.of(keys=path)
    assert rules.identify("ops", {}).kind == "user"  # under serve: the signed-in user
    tenant = rules.identify(None, {"authorization": f"Bearer {alice}"})
    assert tenant.kind == "key" and alice not in tenant.id and "alice" not in tenant.id
    for key in [*PLACEHOLDERS, "", "unused"]:
        with pytest.raises(Refused) as refused:
            rules.identify(None, {"authorization": f"Bearer {key}"})
        assert refused.value.status == 401
    assert parse_keys("# none\n\n") == {}
    for bad, words in (("alice", "line 1 is not"), ("al ice sha256:" + "0" * 64, "line 1 is not"),
                       ("-x sha256:" + "0" * 64, "must be 1-64"),
                       ("a sha256:" + "0" * 64 + "\nb sha256:" + "0" * 64, "listed for two tenants")):
        with pytest.raises(ValueError, match=words):
            parse_keys(bad)
    assert len(KeyFile(path)) == 1
    loose = TenantRules.of()
    assert loose.identify(None, {"authorization": "Bearer sk-1"}) != loose.identify(
        None, {"authorization": "Bearer sk-2"})
    assert loose.identify(None, {}).id == ""
    assert TenantRules.of(rewrite_shared=True).identify(None, {}).id == "shared"
    with pytest.raises(ValueError, match="not an address or a network"):
        TenantRules.of(header="x-org", trusted=["proxy.example"])
