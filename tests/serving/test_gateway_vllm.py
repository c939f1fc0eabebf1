"""The gateway in front of the real vLLM server (the session's, `scripts/vllm.sh`, smollm2-135m),
where what matters is the engine's own prefix cache: the record's destination changes on every
request, and through `kvnotes gateway --policy erratum` vLLM's counters show the base's prefix
reused; the official `openai` client, streamed and not."""

from __future__ import annotations

import httpx
import openai
import pytest

from serving import connect
from tests.serving.conftest import QUESTION, RECORD
from tests.serving.engines import Gateway

pytestmark = pytest.mark.slow
CITIES = ["Oslo", "Madrid", "Rome", "Lisbon"]


def test_errata_through_the_gateway_keep_vllms_prefix_cache_hitting(tmp_path, vllm_url):
    backend = connect(vllm_url)
    gateway = Gateway(tmp_path, f"{vllm_url}/v1", "--policy", "erratum", "--check-rate", "0")
    try:
        assert backend.reset_cache()
        client = gateway.client(timeout=600)
        model = client.models.list().data[0].id

        def ask(city: str, stream: bool):
            return client.chat.completions.with_raw_response.create(
                model=model, max_tokens=6, temperature=0, stream=stream, messages=[
                    {"role": "system", "content": RECORD.replace("Oslo", city)},
                    {"role": "user", "content": QUESTION}])

        assert ask(CITIES[0], stream=False).headers["x-kvnotes-gateway"] == "pass-through; reason=new base"
        before = backend.counters()
        headers, cached = [], []
        for i, city in enumerate(CITIES[1:]):
            raw = ask(city, stream=bool(i % 2))
            headers.append(raw.headers["x-kvnotes-gateway"])
            if i % 2:
                chunks = list(raw.parse())
                assert any(c.choices and c.choices[0].delta.content for c in chunks)
            else:
                usage = raw.parse().usage
                cached.append(usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens)
        after = backend.counters()
        assert headers == ["erratum"] * 3
        hit_rate = (after.hits - before.hits) / (after.queries - before.queries)
        assert hit_rate >= 0.8, hit_rate  # vLLM's own counters over the rewritten requests
        assert min(cached) >= 0.8, cached  # and its per-request usage, passed through to the client
        raw = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=600,  # the same client: its key
                         headers={"Authorization": "Bearer sk-test"}, json={
            "model": model, "stream": True, "max_tokens": 4,
            "messages": [{"role": "system", "content": RECORD.replace("Oslo", "Paris")},
                         {"role": "user", "content": QUESTION}]})
        assert raw.headers["x-kvnotes-gateway"] == "erratum"
        assert raw.text.rstrip().endswith("data: [DONE]")
        assert gateway.metric("kvnotes_gateway_rewrites_total") == 4
        assert gateway.metric("kvnotes_gateway_prefix_tokens_reused_total") > 0
    finally:
        gateway.stop()
        backend.close()


def test_each_tenants_cache_salt_keeps_vllms_prefix_cache_its_own(tmp_path, vllm_url):
    """Issue 48 item 2 on the real vLLM (V1, `--enable-prompt-tokens-details`): through
    `kvnotes gateway --keys`, tenant B sending A's exact prompt reads 0 cached tokens (with
    `--cache-salt off`, as before the salt, it reads A's), A's own repeat still hits, and an online
    run of both tenants' rewritten requests keeps each one's hit rate at 0.9 or more."""
    from serving.gateway.tenants import add_key

    keys = tmp_path / "keys"
    key = {"a": add_key(keys, "alice"), "b": add_key(keys, "bob")}
    backend = connect(vllm_url)
    salted = Gateway(tmp_path / "salted", f"{vllm_url}/v1", "--check-rate", "0", "--keys", str(keys))
    shared = Gateway(tmp_path / "shared", f"{vllm_url}/v1", "--check-rate", "0", "--keys", str(keys),
                     "--cache-salt", "off")
    try:
        clients = {(g, who): openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key[who], max_retries=0,
                                           timeout=600)
                   for g, gw in (("salted", salted), ("shared", shared)) for who in "ab"}
        model = clients["salted", "a"].models.list().data[0].id

        def ask(gateway: str, who: str, city: str) -> tuple[str, int, int]:
            raw = clients[gateway, who].chat.completions.with_raw_response.create(
                model=model, max_tokens=4, temperature=0, messages=[
                    {"role": "system", "content": RECORD.replace("Oslo", city)},
                    {"role": "user", "content": QUESTION}])
            usage = raw.parse().usage
            details = usage.prompt_tokens_details
            return raw.headers["x-kvnotes-gateway"], usage.prompt_tokens, (details.cached_tokens or 0
                                                                           if details else 0)

        assert backend.reset_cache()
        _, tokens, _ = ask("salted", "a", "Oslo")
        assert ask("salted", "b", "Oslo")[2] == 0  # A's exact prompt, from B: no hit
        assert ask("salted", "a", "Oslo")[2] / tokens >= 0.9  # A's own repeat hits
        ask("shared", "a", "Oslo")  # unsalted (as before the salt): B reads what A prefilled
        assert ask("shared", "b", "Oslo")[2] / tokens >= 0.9
        assert backend.reset_cache()
        for who in "ab":  # each tenant's base, prefilled again
            ask("salted", who, "Oslo")
        before = backend.counters()
        seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
        for city in ["Madrid", "Rome", "Lisbon", "Paris", "Bergen"]:
            for who in "ab":
                header, prompt, cached = ask("salted", who, city)
                assert header == "erratum"
                seen[who].append((prompt, cached))
        after = backend.counters()
        rates = {who: sum(c for _, c in seen[who]) / sum(p for p, _ in seen[who]) for who in "ab"}
        assert min(rates.values()) >= 0.9, rates
        assert (after.hits - before.hits) / (after.queries - before.queries) >= 0.9  # vLLM's own counters
    finally:
        salted.stop()
        shared.stop()
        backend.close()
