"""The serving backend protocol fits two engines: the same replay, through `serving.backend`, against
a real HTTP peer speaking vLLM's documented API and one speaking SGLang's (`tests.serving.engines`);
the real vLLM server's side is `test_replay_server.py`."""

from __future__ import annotations

import pytest

from serving import Backend, ReplayError, ReplaySpec, connect, replay
from serving.backend import SglangBackend, VllmBackend
from tests.serving.conftest import CHOICES, DOCUMENT, QUESTION
from tests.serving.engines import Engine


@pytest.fixture(params=["vllm", "sglang"])
def engine(request):
    served = Engine(request.param)
    yield served
    served.close()


def test_each_engine_answers_the_four_calls(engine):
    with connect(engine.url, engine="vllm" if engine.dialect == "vllm" else "SGLang") as backend:
        assert isinstance(backend, Backend)
        assert isinstance(backend, VllmBackend if engine.dialect == "vllm" else SglangBackend)
        info = backend.info()
        assert (info.model, info.max_model_len, info.chat) == ("smollm2-135m", 8192, True)
        tokens = backend.prompt_tokens("hello")  # the chat template around one user message
        assert len(tokens) == len("<|user|>hello\n<|assistant|>") == 27
        assert backend.reset_cache() is True
        first = backend.complete("destination: Oslo\nmore text", 8)
        second = backend.complete("destination: Oslo\nother text", 8)
        assert first.text == second.text == "The destination is Oslo."
        assert first.cached_tokens == 0 and second.cached_tokens == len("<|user|>destination: Oslo\n")
        counters = backend.counters()
        assert counters.queries == first.prompt_tokens + second.prompt_tokens
        assert counters.hits == second.cached_tokens
        assert first.ttft_ms > 0


def test_the_same_replay_runs_on_both_engines(engine):
    """The erratum keeps the prefix: its hit rate is far above the in-place rewrite's, and the
    engine's own counters agree with the per-request usage, on vLLM's API and on SGLang's."""
    start = DOCUMENT.index("Oslo")
    spec = ReplaySpec(DOCUMENT, start, start + 4, "destination", ("Madrid", "Rome", "Lisbon"), QUESTION,
                      CHOICES, requests=3, rate=50.0, concurrency=1)  # each value once
    result = replay(spec, engine.url, engine=engine.dialect)
    erratum, in_place = result.variants["erratum"], result.variants["in_place"]
    assert erratum.prefix_hit_rate > 0.9 > 0.1 > in_place.prefix_hit_rate
    assert erratum.metrics_hit_rate == pytest.approx(erratum.prefix_hit_rate, abs=0.01)
    assert erratum.cache_reset and in_place.cache_reset
    assert erratum.agreement == 1.0  # the engine reads the last value stated: the erratum's


def test_an_unknown_engine_is_named():
    with pytest.raises(ReplayError, match="engine must be one of vllm, sglang, got 'tgi'"):
        connect("http://127.0.0.1:9", engine="tgi")
