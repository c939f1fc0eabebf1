"""The bound on each answer of a replay (issue 44): `request_s` to the first token, then between
tokens, never on the whole of a healthy stream. Behind other requests' prefills an answer's tokens
come slowly (on vLLM's CPU backend, 6 in-place edits of a 2.7k-token record: the first answer's 16
tokens took 32 s after its first, on 2 busy cores), and cutting it at `request_s` from its start
failed the replay with "in_place request 1 ... did not answer as vLLM does". The servers are real
HTTP servers on loopback speaking vLLM's API (`tests.serving.engines.Engine`)."""

from __future__ import annotations

import pytest

from serving import Bounds, ReplayError, ReplaySpec, replay
from tests.serving.engines import Engine

DOCUMENT = "CONSIGNMENT RECORD\nconsignee: Halden Tools\ndestination: Tromso\nweight: 412 kg\n"
START = DOCUMENT.index("Tromso")


def _spec(**kw) -> ReplaySpec:
    return ReplaySpec(DOCUMENT, START, START + 6, "destination", ("Valencia",),
                      "What is the destination of this consignment?", (), **{"rate": 50.0, **kw})


@pytest.fixture
def engine():
    made: list[Engine] = []

    def make(**kw) -> Engine:
        made.append(Engine(**kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_an_answer_whose_tokens_keep_coming_is_not_cut_at_the_bound(engine):
    """8 events 0.4 s apart: each answer takes 3.2 s, past a 2 s bound, yet every piece comes well
    within it (5x). Cut at 2 s before the fix."""
    server = engine(fault="paced", delay_s=0.4)
    result = replay(_spec(variants=("in_place",)), server.url, bounds=Bounds(request_s=2.0))
    for name, v in result.variants.items():
        assert v.answers == ["The destination is Valencia."], name
        assert v.requests == 1 and v.ttft_ms[0] < 2000, name
    assert len(server.completions) == 2  # the warm-up and the request, both answered


def test_an_answer_that_never_ends_is_still_bounded_by_its_events(engine):
    """Empty events every 50 ms forever after the answer's words: past max_tokens + 8 events the
    request fails, naming why, long before the 60 s bound between tokens."""
    server = engine(fault="trickle", delay_s=0.05)
    with pytest.raises(ReplayError) as failed:
        replay(_spec(variants=("erratum",), max_tokens=16), server.url,
               bounds=Bounds(request_s=60.0, quote=True))
    assert "erratum warm-up request failed" in str(failed.value)
    assert str(failed.value).endswith("(POST /v1/chat/completions): more than 24 events for an answer of at "
                                      "most 16 tokens"), failed.value
    assert server.gone.wait(10)  # the stream was closed by the replay


def test_an_answer_whose_tokens_stop_is_cut_one_bound_after_the_last(engine):
    """The answer's words, then silence mid-stream ("stall": 30 s): cut one 1 s bound after its
    last token, saying so."""
    server = engine(fault="stall", delay_s=30.0)
    with pytest.raises(ReplayError) as failed:
        replay(_spec(variants=("erratum",)), server.url, bounds=Bounds(request_s=1.0, quote=True))
    assert "(POST /v1/chat/completions): nothing came within the request's bound of 1 s" in str(failed.value)
