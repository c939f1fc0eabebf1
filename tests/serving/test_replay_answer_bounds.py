"""The bound on each answer of a replay (issue 44): `request_s` to the first token, then between
tokens, never on the whole of a healthy stream. Behind other requests' prefills an answer's tokens
come slowly (on vLLM's CPU backend, 6 in-place edits of a 2.7k-token record: the first answer's 16
tokens took 32 s after its first, on 2 busy cores), and cutting it at `request_s` from its start
failed the replay with "in_place request 1 ... did not answer as vLLM does". The servers are real
HTTP servers on loopback speaking vLLM's API (`tests.serving.engines.Engine`)."""

from __future__ import annotations

import time

import pytest

from serving import Bounds, ReplayError, ReplaySpec, TrajectoryReplaySpec, replay, replay_trajectory
from tests.serving.conftest import replay_notebook, run_replay_task
from tests.serving.engines import Engine
from vocabulary.trajectories import FieldSpec, TurnSpec

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


# ---- issue 52: a bound on silence, not on queueing --------------------------------------------------


@pytest.mark.parametrize("run", ["replay", "trajectory"])
def test_an_answer_queued_behind_a_working_server_waits_past_the_bound(engine, run):
    """Each request waits 3 s before its first byte, three times the 1 s bound, while the server's
    /metrics show other work going on (prompt tokens and engine steps growing every 0.1 s): a
    queue, not a hang. Every answer comes, its TTFT past the bound. Cut at 1 s before the fix."""
    server = engine(fault="queued", delay_s=3.0)
    if run == "replay":
        result = replay(_spec(variants=("in_place",)), server.url,
                        bounds=Bounds(request_s=1.0))
        v = result.variants["in_place"]
        assert v.answers == ["The destination is Valencia."], v.answers
        ttfts = v.ttft_ms
    else:
        result = replay_trajectory(_trajectory(), server.url, bounds=Bounds(request_s=1.0))
        turns = result.variants["erratum"].turns
        assert [t.answer for t in turns] == ["The destination is Porto.", "The destination is Porto."]
        ttfts = [t.ttft_ms for t in turns]
    assert min(ttfts) > 2000, ttfts  # each waited twice its bound and more, and was not cut
    print(f"\nqueued 3 s behind others with a 1 s bound: TTFTs {ttfts} ms")


def _trajectory() -> TrajectoryReplaySpec:
    """Two turns over DOCUMENT, the destination changed at the first (erratum only)."""
    return TrajectoryReplaySpec(DOCUMENT, (FieldSpec("destination", START, START + 6),),
                                (TurnSpec(append="log: loaded\n", fields={"destination": "Porto"}),
                                 TurnSpec(append="log: sailed\n")),
                                "What is the destination of this consignment?", (), variants=("erratum",))


def _failed(server: Engine, run: str) -> tuple[str, float]:
    """The replay's (or trajectory's) failure, with a 1 s bound and nothing quoted (as on the web),
    and how long the server had held its last request when it ended."""
    t0 = time.monotonic()
    with pytest.raises(ReplayError) as failed:
        if run == "replay":
            replay(_spec(variants=("in_place",)), server.url,
                   bounds=Bounds(request_s=1.0))
        else:
            replay_trajectory(_trajectory(), server.url, bounds=Bounds(request_s=1.0))
    return str(failed.value), time.monotonic() - t0


@pytest.mark.parametrize("run", ["replay", "trajectory"])
def test_a_server_that_accepts_and_never_answers_ends_the_replay_naming_the_request(engine, run):
    """The warm-up is answered, then the next request is accepted and never answered (60 s of
    silence, the server's counters standing still): the replay fails one 1 s bound later, naming
    that request and what the server's /metrics showed, and closes its connection."""
    server = engine(fault="silent", delay_s=60.0, faulty_from=1)
    message, took = _failed(server, run)
    what = "in_place request 1 (field = 'Valencia') failed" if run == "replay" else "erratum turn 1 failed"
    assert message.startswith(what), message
    assert message.endswith("(POST /v1/chat/completions): nothing came within the request's bound of 1 s, "
                            "and the server showed no progress for 1 s (its /metrics: 0 running, 1 waiting; "
                            f"{server.prompt_tokens} prompt tokens, {server.generated} generated, "
                            f"{server.steps} engine steps, "
                            f"{server.queries} tokens looked up in its cache in all)"), message
    assert server.gone.wait(10)  # the replay closed the connection it waited on
    print(f"\nsilent server, 1 s bound: ended after {took:.1f} s: {message}")


@pytest.mark.parametrize("run", ["replay", "trajectory"])
def test_a_server_that_stops_mid_stream_ends_the_replay_naming_the_request(engine, run):
    """The warm-up is answered, then the next answer's first word comes and the server falls silent
    for 60 s with its counters standing still: cut one bound after that word, naming the request."""
    server = engine(fault="stall", delay_s=60.0, faulty_from=1)
    message, took = _failed(server, run)
    what = "in_place request 1 (field = 'Valencia') failed" if run == "replay" else "erratum turn 1 failed"
    assert message.startswith(what), message
    assert "(POST /v1/chat/completions): nothing came within the request's bound of 1 s, and the server " \
           "showed no progress for 1 s (its /metrics: 0 running, 0 waiting;" in message, message
    print(f"\nserver stalled mid-stream, 1 s bound: ended after {took:.1f} s")


def test_the_webs_replay_waits_for_a_working_server_and_stops_for_a_stuck_one(make_client, engine):
    """The same rule on the web (issue 52): a replay saved through the API and run by its task (in this
    process, as a worker runs it) with `KVNOTES_REPLAY_REQUEST_TIMEOUT=1`. Queued 3 s behind a working
    server it succeeds; against a server that accepts and never answers it fails, its row naming the
    request and what the server's /metrics showed."""
    client = make_client(KVNOTES_REPLAY_REQUEST_TIMEOUT="1")
    nid = replay_notebook(client)
    ends = {}
    for fault in ("queued", "silent"):
        server = engine(fault=fault, delay_s=3.0 if fault == "queued" else 60.0, faulty_from=1)
        made = client.post(f"/api/notebooks/{nid}/replays", json={
            "url": server.url, "rate": 1000, "variants": ["in_place"], "max_tokens": 4})
        assert made.status_code == 201, made.text
        result: dict = {}
        run_replay_task(made.json()["id"], result)
        ends[fault] = (result, client.get(f"/api/replays/{made.json()['id']}").json())
    result, row = ends["queued"]
    assert result["status"] == row["status"] == "succeeded", row
    assert row["result"]["variants"]["in_place"]["ttft_ms"][0] > 2000, row["result"]
    result, row = ends["silent"]
    assert result["status"] == row["status"] == "failed", row
    assert row["error"].startswith("in_place request 1 (field = 'Rome') failed: the server at "), row["error"]
    assert "nothing came within the request's bound of 1 s, and the server showed no progress for 1 s " \
           "(its /metrics: 0 running, 1 waiting;" in row["error"], row["error"]
