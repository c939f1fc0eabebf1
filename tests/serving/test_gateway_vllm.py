"""The gateway in front of the real vLLM server (the session's, `scripts/vllm.sh`, smollm2-135m),
where what matters is the engine's own prefix cache: the record's destination changes on every
request, and through `kvnotes gateway --policy erratum` vLLM's counters show the base's prefix
reused; the official `openai` client, streamed and not."""

from __future__ import annotations

import httpx
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
