"""The replay against a real vLLM server (the session's `scripts/vllm.sh`, smollm2-135m): what it
measures per variant, that the per-request cached tokens agree with the server's /metrics, the
`kvnotes replay --json` shape, and the errors that stop a replay before (or while) it runs."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest

from serving import ReplayError, ReplaySpec, replay
from serving.backend import connect
from tests.conftest import REPO, free_port, kvnotes_cli
from tests.serving.conftest import CHOICES, DOCUMENT, QUESTION, DyingServer

pytestmark = pytest.mark.slow
START = DOCUMENT.index("Oslo")
REPORTED = {"requests", "prefix_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "throughput_rps", "prompt_tokens",
            "agreement"}


def spec(document: str = DOCUMENT, **kw) -> ReplaySpec:
    return ReplaySpec(document, START, START + 4, "destination", ("Madrid", "Rome", "Lisbon"), QUESTION,
                      CHOICES,
                      **{"rate": 4.0, "concurrency": 2, **kw})


def _queries(url: str) -> float:
    with connect(url) as server:
        return server.counters().queries


def test_errata_keep_the_prefix_cache_and_in_place_edits_lose_it(vllm_url):
    result = replay(spec(), vllm_url, "smollm2-135m")
    v = result.variants
    assert list(v) == ["in_place", "erratum", "hoist"] and result.max_model_len == 4096
    for name, r in v.items():
        assert r.requests == 3 and len(r.ttft_ms) == 3 and r.cache_reset, name
        assert 0 < r.ttft_p50_ms <= r.ttft_p90_ms <= max(r.ttft_ms), name
        assert r.throughput_rps > 0 and r.prompt_tokens > 300, name
        # the per-request cached tokens and the server's own counters tell the same story
        assert r.metrics_hit_rate == pytest.approx(r.prefix_hit_rate, abs=0.005), name
        assert all(answer in CHOICES for answer in r.answers), r.answers  # constrained to the choices
    # the field is near the top: rewriting it leaves no full cache block in front of it
    assert v["in_place"].prefix_hit_rate <= 0.1 and v["in_place"].estimated_prefix_share < 0.1
    # the erratum and the hoisted field keep the document's blocks (block rounding loses < 128 tokens)
    for name in ("erratum", "hoist"):
        assert v[name].prefix_hit_rate >= 0.6, name
        assert v[name].estimated_prefix_share >= v[name].prefix_hit_rate, name
        assert v[name].estimated_prefix_share - v[name].prefix_hit_rate < 128 / v[name].prompt_tokens, name
    assert v["erratum"].prompt_tokens > v["in_place"].prompt_tokens  # the erratum's own tokens


def test_kvnotes_replay_prints_the_json_the_issue_names(vllm_url, tmp_path):
    document = tmp_path / "log.txt"
    document.write_text(DOCUMENT)
    out = kvnotes_cli("replay", "--url", f"{vllm_url}/v1", "--document", str(document), "--field", "Oslo",
                      "--values", "Madrid,Rome", "--question", QUESTION, "--choices", ",".join(CHOICES),
                      "--variants", "erratum,in_place", "--rate", "4", "--json",
                      env={"PATH": f"{REPO}/.venv/bin:/usr/bin:/bin"}, timeout=600)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data["variants"]) == ["erratum", "in_place"]
    for numbers in data["variants"].values():
        assert REPORTED <= set(numbers) and numbers["requests"] == 2
    rates = {name: numbers["prefix_hit_rate"] for name, numbers in data["variants"].items()}
    assert rates["erratum"] > rates["in_place"] + 0.5


def test_a_model_the_server_does_not_serve_is_named(vllm_url):
    with pytest.raises(ReplayError, match="model 'gpt-4' is not served by .*; it serves: smollm2-135m"):
        replay(spec(), vllm_url, "gpt-4")


def test_a_prompt_longer_than_max_model_len_fails_before_any_request(vllm_url):
    before = _queries(vllm_url)
    long_document = DOCUMENT + "\n".join([DOCUMENT] * 5)  # ~4,200 tokens
    too_long = r"in_place warm-up: the prompt is \d+ tokens .* max_model_len of 4096"
    with pytest.raises(ReplayError, match=too_long):
        replay(spec(long_document), vllm_url)
    assert _queries(vllm_url) == before  # nothing reached the engine


def test_an_unreachable_server_is_named():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ReplayError, match=f"the server at {url} did not answer as vLLM does"):
        replay(spec(), url)


def test_a_server_that_dies_mid_replay_fails_the_replay_and_names_the_request(vllm_url):
    relay = DyingServer(vllm_url)

    def die_after_first(done: int, total: int, variant: str) -> None:
        if done == 1:
            relay.kill()

    with pytest.raises(ReplayError, match=r"in_place request [23] \(field = '(Rome|Lisbon)'\) failed: "):
        replay(spec(rate=100.0, concurrency=1), relay.url, on_progress=die_after_first)
    with pytest.raises(httpx.ConnectError):
        httpx.get(relay.url + "/v1/models", timeout=2)


def test_a_model_without_a_chat_template_is_replayed_with_plain_prompts(base_model_url, vllm_url):
    """smollm2-135m served without its chat template, as a base model is published: the replay tells
    from /tokenize, sends the plain text kvnotes prefills for such a model (the document, the
    question, "\\nAnswer:") through /v1/completions, and the cache story is the same."""
    from transformers import AutoTokenizer

    with connect(vllm_url) as chat:
        assert chat.info().prompt_format == "chat"
    with connect(base_model_url) as plain:
        info = plain.info()
        assert (info.chat, info.prompt_format) == (False, "plain")
        text = DOCUMENT + "\n\nQuestion: " + QUESTION
        tokenizer = AutoTokenizer.from_pretrained(REPO / "var" / "test-data" / "models" / "smollm2-135m")
        assert plain.prompt_tokens(text) == tokenizer(text + "\nAnswer:").input_ids  # kvnotes's base Frame
    result = replay(dataclasses.replace(spec(), values=("Madrid", "Rome")), base_model_url)
    assert result.prompt_format == "plain"
    v = result.variants
    assert v["in_place"].prefix_hit_rate <= 0.1 and v["erratum"].prefix_hit_rate >= 0.6, v
    for name, r in v.items():
        assert r.requests == 2 and r.metrics_hit_rate == pytest.approx(r.prefix_hit_rate, abs=0.005), name
        assert all(answer.strip() in CHOICES for answer in r.answers), r.answers  # " Oslo", after "Answer:"
