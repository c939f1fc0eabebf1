"""A trajectory replayed on a real vLLM server (the session's `scripts/vllm.sh`, smollm2-135m): one
request per turn in order, per variant, each turn's hit rate and TTFT as the server reports them,
and over the turns the hit rate (checked against /metrics) and the cumulative TTFT; the same through
`kvnotes replay --turns … --json` and through the API of `kvnotes serve` with a real worker, and a
turn too long for the server named before any request."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from serving import ReplayError, replay_trajectory
from serving.backend import connect
from tests.conftest import REPO, kvnotes_cli
from tests.serving.conftest import CHOICES, LOG_LINES, QUESTION, RECORD, START, trajectory
from vocabulary.trajectories import TurnSpec

pytestmark = pytest.mark.slow
def test_each_turn_reports_its_hit_rate_and_errata_keep_the_cache_where_in_place_loses_it(vllm_url):
    seen: list[tuple[int, int, str]] = []
    result = replay_trajectory(trajectory(), vllm_url, on_progress=lambda d, t, v: seen.append((d, t, v)))
    order = ("in_place", "erratum", "hoist")
    assert seen == [(7 * order.index(v) + k, 21, v) for v in order for k in range(1, 8)]
    v = result.variants
    assert list(v) == ["in_place", "erratum", "hoist"] and result.max_model_len == 4096
    for name, r in v.items():
        assert len(r.turns) == 7 and [t.index for t in r.turns] == list(range(7)) and r.cache_reset, name
        for t in r.turns:  # every turn has its hit rate, from the server's own usage
            assert t.prompt_tokens > 1200 and 0 <= t.cached_tokens <= t.prompt_tokens, (name, t)
            assert t.hit_rate == pytest.approx(t.cached_tokens / t.prompt_tokens, abs=1e-4)
            # vLLM caches whole blocks: what it kept is kvnotes's estimate rounded down to a block
            assert t.hit_rate <= t.estimated_share + 1e-4, (name, t)
            assert t.answer in CHOICES, (name, t.answer)  # constrained to the choices
        # cumulative TTFT is the turns' TTFTs summed, and the overall rate is the turns' tokens'
        assert r.cumulative_ttft_ms == pytest.approx(sum(t.ttft_ms for t in r.turns), abs=0.05), name
        assert [t.cumulative_ttft_ms for t in r.turns][-1] == r.cumulative_ttft_ms
        assert r.prompt_tokens == sum(t.prompt_tokens for t in r.turns)
        assert r.hit_rate == pytest.approx(r.cached_tokens / r.prompt_tokens, abs=1e-4)
        assert r.metrics_hit_rate == pytest.approx(r.hit_rate, abs=0.005), name  # /metrics agrees
        assert [t.changed for t in r.turns] == [[], [], ["destination"], [], ["destination"], [], []], name
        assert [t.edit_followed is None for t in r.turns] == [True, True] + [False] * 5, name
    erratum, in_place, hoist = v["erratum"], v["in_place"], v["hoist"]
    # each erratum prompt extends the last: after the first turn the cache holds nearly all of it
    assert all(t.hit_rate > 0.8 for t in erratum.turns[1:]), [t.hit_rate for t in erratum.turns]
    assert [t.errata for t in erratum.turns] == [0, 0, 1, 1, 2, 2, 2]
    # rewriting the destination in place breaks the prompt at the field, near the top
    for i in (2, 4):
        assert in_place.turns[i].hit_rate < 0.1 < 0.8 < erratum.turns[i].hit_rate, i
        assert in_place.turns[i].ttft_ms > erratum.turns[i].ttft_ms, i
    assert erratum.hit_rate > in_place.hit_rate + 0.2 and hoist.hit_rate > in_place.hit_rate + 0.2
    assert erratum.cumulative_ttft_ms < in_place.cumulative_ttft_ms


def test_kvnotes_replay_turns_prints_every_turn_as_json(vllm_url, tmp_path):
    spec = trajectory(6)
    (tmp_path / "record.txt").write_text(RECORD)
    lines = [{"append": t.append, **({"fields": t.fields} if t.fields else {})} for t in spec.turns]
    (tmp_path / "turns.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = kvnotes_cli("replay", "--url", f"{vllm_url}/v1", "--document", str(tmp_path / "record.txt"),
                      "--turns", str(tmp_path / "turns.jsonl"), "--question", QUESTION,
                      "--choices", ",".join(CHOICES), "--variants", "erratum,in_place", "--json",
                      env={"PATH": f"{REPO}/.venv/bin:/usr/bin:/bin"}, timeout=600)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data["variants"]) == ["erratum", "in_place"]
    for name, v in data["variants"].items():
        assert len(v["turns"]) == 6 and all(0 <= t["hit_rate"] <= 1 for t in v["turns"]), name
        assert v["cumulative_ttft_ms"] == pytest.approx(sum(t["ttft_ms"] for t in v["turns"]), abs=0.05)
    # the destination found as "destination: Oslo" in the record, changed at turn 3
    assert data["variants"]["in_place"]["turns"][2]["hit_rate"] < 0.1 < 0.8 < \
        data["variants"]["erratum"]["turns"][2]["hit_rate"]


def test_a_turn_too_long_for_the_server_is_named_before_any_request(vllm_url):
    with connect(vllm_url) as server:
        before = server.counters().queries
    long_turn = TurnSpec(append="\n".join(LOG_LINES * 8))  # ~3,000 tokens more at turn 3
    spec = trajectory(4)
    spec = spec.replace(turns=(*spec.turns[:2], long_turn, spec.turns[3]))
    with pytest.raises(ReplayError, match=r"in_place turn 3: the prompt is \d+ tokens and the answer up to "
                                          r"16, beyond the server's max_model_len of 4096"):
        replay_trajectory(spec, vllm_url)
    with connect(vllm_url) as server:
        assert server.counters().queries == before  # nothing reached the engine


def test_a_trajectory_replayed_through_the_api_reports_a_hit_rate_per_turn(served):
    """The issue's done check: a trajectory of `kvnotes serve`'s API, replayed on vLLM by the worker,
    reads back with a hit rate and a TTFT for every turn of every variant."""
    with httpx.Client(base_url=served.url, timeout=120) as client:
        r = client.post("/api/notebooks", json={"title": "shipment", "model": "tiny-llama", "text": RECORD})
        nid = r.json()["id"]
        r = client.post(f"/api/notebooks/{nid}/fields", json={"start": START, "end": START + 4,
                                                              "new_value": "Madrid", "label": "destination"})
        assert r.status_code == 201, r.text
        turns = [{"append": t.append, **({"fields": t.fields} if t.fields else {})}
                 for t in trajectory(6).turns]
        r = client.post(f"/api/notebooks/{nid}/trajectories",
                        json={"turns": turns, "question": QUESTION, "choices": list(CHOICES),
                              "strategies": ["erratum"]})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        client.post(f"/api/trajectories/{tid}/cancel")  # its engine run is not needed to replay its turns
        started = client.post(f"/api/trajectories/{tid}/replays", json={"variants": ["in_place", "erratum"]})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]
        deadline = time.monotonic() + 600
        while (replay := client.get(f"/api/replays/{rid}").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, replay
            time.sleep(1)
        assert replay["status"] == "succeeded", replay["error"]
        assert (replay["kind"], replay["trajectory_id"]) == ("trajectory", tid)
        variants = replay["result"]["variants"]
        for name, v in variants.items():
            assert [t["index"] for t in v["turns"]] == list(range(6)), name
            assert all(0 <= t["hit_rate"] <= 1 and t["ttft_ms"] > 0 for t in v["turns"]), name
            assert v["cumulative_ttft_ms"] == pytest.approx(sum(t["ttft_ms"] for t in v["turns"]), abs=0.05)
        assert all(t["hit_rate"] > 0.8 for t in variants["erratum"]["turns"][1:])
        assert variants["in_place"]["turns"][2]["hit_rate"] < 0.1
        panel = client.get(f"/trajectories/{tid}/serving").text
        turn3 = panel.split('<tr data-turn="3" class="changed">')[1].split("</tr>")[0]
        for name, v in variants.items():
            rate = f"{v['turns'][2]['hit_rate'] * 100:.0f}%"
            assert f'data-variant="{name}" data-metric="hit_rate"' in turn3 and f">{rate}<" in turn3
