"""A trajectory's replay through the API and the trajectory page without a real server (the embedded
broker, no worker; a local stand-in answers the server checks): what is refused before anything is
saved (no server, a server that does not answer, an unknown variant, a turn that cannot be sent:
422 naming it), a replay queued, listed with its trajectory and not in the notebook's Serving panel,
cancelled from its box; and a stored result read back turn by turn by the API, the panel, the
permalink and the CSV; both kinds of row in one table, on SQLite and PostgreSQL."""

from __future__ import annotations

import re

from data.models import utcnow
from data.replays import Replay
from tests.conftest import free_port, migrate
from vocabulary.replay import TrajectoryReplayResult, TrajectoryVariantResult, TurnHit

DOC = ("SUPPORT SESSION: account record\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
       "Policy: only accounts whose status is active may log in.\n")
TURNS = [{"append": f"\n[turn {i + 1}] tool result {i + 1}."} for i in range(6)]
TURNS[2]["fields"] = {"status": "suspended"}
TURNS[4]["fields"] = {"status": "active"}


def _trajectory(client, turns=TURNS) -> tuple[int, int]:
    r = client.post("/api/notebooks", json={"title": "support", "model": "smollm2-135m", "text": DOC})
    assert r.status_code == 201, r.text
    nid = r.json()["id"]
    start = DOC.index("active")
    r = client.post(f"/api/notebooks/{nid}/fields",
                    json={"start": start, "end": start + 6, "new_value": "suspended", "label": "status"})
    assert r.status_code == 201, r.text
    r = client.post(f"/api/notebooks/{nid}/trajectories",
                    json={"turns": turns, "question": "May Dana log in now?", "choices": ["yes", "no"],
                          "strategies": ["erratum"]})
    assert r.status_code == 201, r.text
    return nid, r.json()["id"]


def test_bad_replays_are_refused_naming_the_problem_and_a_good_one_is_queued(make_client, fake_vllm):
    client = make_client()
    nid, tid = _trajectory(client)
    fake = fake_vllm()
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cases = [({}, "no vLLM server is configured: the operator sets KVNOTES_VLLM_URL"),
             ({"url": dead}, f"the server at {dead[:-3]} did not answer as vLLM does"),
             ({"url": fake.url, "variants": ["stale"]}, "variants: unknown 'stale'"),
             ({"url": fake.url, "rate": 2}, "extra_forbidden")]
    for body, message in cases:
        r = client.post(f"/api/trajectories/{tid}/replays", json=body)
        assert r.status_code == 422 and message in r.text, (body, r.text)
    assert client.post("/api/trajectories/987654/replays", json={"url": fake.url}).status_code == 404
    assert client.get(f"/api/trajectories/{tid}/replays").json() == []

    r = client.post(f"/api/trajectories/{tid}/replays",
                    json={"url": fake.url, "variants": ["erratum", "hoist"]})
    assert r.status_code == 201, r.text
    replay = r.json()
    assert (replay["kind"], replay["trajectory_id"], replay["notebook_id"], replay["status"]) == \
        ("trajectory", tid, nid, "queued")
    assert replay["snapshot"]["model"] == "fake-model" and len(replay["snapshot"]["turns"]) == 6
    assert replay["snapshot"]["turns"][2]["fields"] == {"status": "suspended"}
    assert [x["id"] for x in client.get(f"/api/trajectories/{tid}/replays").json()] == [replay["id"]]
    assert [x["kind"] for x in client.get(f"/api/notebooks/{nid}/replays").json()] == ["trajectory"]
    assert f"Replay #{replay['id']}" not in client.get(f"/notebooks/{nid}/serving").text  # edits only there

    panel = client.get(f"/trajectories/{tid}/serving").text
    assert f'hx-post="/trajectories/{tid}/replays"' in panel and f"Replay #{replay['id']}" in panel
    assert f'hx-post="/replays/{replay["id"]}/cancel"' in panel
    box = client.post(f"/replays/{replay['id']}/cancel").text
    assert "Cancelled: no more requests were sent" in box and 'data-kind="trajectory"' in box
    assert client.get(f"/api/replays/{replay['id']}").json()["status"] == "cancelled"
    page = client.get(f"/trajectories/{tid}")
    assert f'hx-get="/trajectories/{tid}/serving"' in page.text  # the trajectory page loads the panel

    form = client.post(f"/trajectories/{tid}/replays", data={"url": dead, "variants": ["erratum"]})
    assert form.status_code == 422 and "did not answer as vLLM does" in form.text


def test_a_turn_that_cannot_be_sent_is_named(make_client, fake_vllm):
    client = make_client()
    turns = [*TURNS[:1], {"append": "\nmore.", "question": "Is it paid?", "choices": ["yes"]}]
    _, tid = _trajectory(client, turns)
    r = client.post(f"/api/trajectories/{tid}/replays", json={"url": fake_vllm().url})
    assert r.status_code == 422, r.text
    assert "turns.1" in r.text and "turn 2: give at least two choices, or none for a free answer" in r.text


def _result(tid: int) -> TrajectoryReplayResult:
    def turns(rates: list[float]) -> list[TurnHit]:
        out, cumulative = [], 0.0
        for i, rate in enumerate(rates):
            cumulative = round(cumulative + 100.0 + 10 * i, 1)
            out.append(TurnHit(index=i, prompt_tokens=1000, cached_tokens=round(rate * 1000), hit_rate=rate,
                               ttft_ms=100.0 + 10 * i, cumulative_ttft_ms=cumulative, answer="no",
                               edit_followed=None if i < 2 else "neither",
                               changed=["status"] if i in (2, 4) else [], estimated_share=rate))
        return out

    variants = {}
    for name, rates in (("in_place", [0.9, 0.9, 0.0, 0.9, 0.0, 0.9]), ("erratum", [0.9] * 6)):
        t = turns(rates)
        cached = sum(x.cached_tokens for x in t)
        variants[name] = TrajectoryVariantResult(
            turns=t, hit_rate=round(cached / 6000, 4), cumulative_ttft_ms=t[-1].cumulative_ttft_ms,
            prompt_tokens=6000, cached_tokens=cached, followed=0, moved_turns=4,
            metrics_hit_rate=round(cached / 6000, 4), cache_reset=True)
    return TrajectoryReplayResult("http://127.0.0.1:9", "fake-model", 4096, 1.5, variants, trajectory_id=tid)


def test_a_stored_result_reads_back_turn_by_turn(make_client, fake_vllm):
    client = make_client()
    nid, tid = _trajectory(client)
    r = client.post(f"/api/trajectories/{tid}/replays", json={"url": fake_vllm().url,
                                                              "variants": ["in_place", "erratum"]})
    rid = r.json()["id"]
    from data.db import get_sessionmaker

    with get_sessionmaker()() as s:  # what the worker writes once the turns were replayed
        row = s.get(Replay, rid)
        row.status, row.result, row.finished_at = "succeeded", _result(tid), utcnow()
        s.commit()
    got = client.get(f"/api/replays/{rid}").json()
    in_place = got["result"]["variants"]["in_place"]
    assert [t["hit_rate"] for t in in_place["turns"]] == [0.9, 0.9, 0.0, 0.9, 0.0, 0.9]
    assert in_place["cumulative_ttft_ms"] == 750.0 and got["result"]["variants"]["erratum"]["hit_rate"] == 0.9
    for html in (client.get(f"/trajectories/{tid}/serving").text, client.get(f"/replays/{rid}").text):
        summary = html.split('data-variant="in_place"')[1].split("</tr>")[0]
        assert 'data-metric="hit_rate">60.0%<' in summary
        turn3 = html.split('<tr data-turn="3" class="changed">')[1].split("</tr>")[0]
        assert "status → suspended" in turn3 and ">0%<" in turn3 and ">90%<" in turn3
        figure = html.split('aria-label="Prefix-cache hit rate per turn"')[1].split("</svg>")[0]
        heights = re.findall(r'cy="([0-9.]+)"[^>]*data-variant="erratum"', figure)
        assert len(heights) == 6 and len(set(heights)) == 1  # a point per turn, the same rate at each
        dips = re.findall(r'cy="([0-9.]+)"[^>]*data-variant="in_place"', figure)
        assert [float(y) > float(heights[0]) for y in dips] == [False, False, True, False, True, False]
    csv = client.get(f"/replays/{rid}/export.csv").text.splitlines()
    assert csv[0].startswith("variant,turn,changed,prompt_tokens,cached_tokens,hit_rate")
    assert len(csv) == 1 + 12  # a line per variant and turn
    assert csv[3].startswith("in_place,3,status,1000,0,0.0,")
    assert client.get(f"/replays/{rid}/export.json").json()["result"] == got["result"]


def _rows_round_trip(url: str) -> None:
    """Edit and trajectory replays in one table: each reads back typed, the notebook's edit replays
    and a trajectory's replays are told apart by the snapshot, and deleting the notebook deletes
    both."""
    from sqlalchemy import delete, func, select
    from sqlalchemy.orm import Session

    from app.services.replays import replays_of, replays_of_trajectory
    from data.db import make_engine
    from data.models import Notebook
    from vocabulary.replay import ReplaySpec, TrajectoryReplaySpec
    from vocabulary.trajectories import FieldSpec, TurnSpec

    migrate(url)
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            nb = Notebook(title="t", model="smollm2-135m", document=DOC)
            s.add(nb)
            s.flush()
            start = DOC.index("active")
            edit = ReplaySpec(DOC, start, start + 6, "status", ("suspended",), "May Dana log in?")
            spec = TrajectoryReplaySpec(DOC, (FieldSpec("status", start, start + 6),),
                                        (TurnSpec(append="\nx.", fields={"status": "suspended"}),), "Q?",
                                        trajectory_id=41)
            rows = [Replay(notebook_id=nb.id, snapshot=edit, status="succeeded"),
                    Replay(notebook_id=nb.id, snapshot=spec, status="succeeded", result=_result(41)),
                    Replay(notebook_id=nb.id, snapshot=spec.replace(trajectory_id=42), status="queued")]
            s.add_all(rows)
            s.commit()
            ids = [r.id for r in rows]
            nid = nb.id
        with Session(engine) as s:
            assert [r.id for r in replays_of(s, nid, edits_only=True)] == [ids[0]]
            assert [r.id for r in replays_of(s, nid)] == ids[::-1]
            got = replays_of_trajectory(s, 41)
            assert [r.id for r in got] == [ids[1]] and got[0].trajectory_id == 41
            assert isinstance(got[0].snapshot, TrajectoryReplaySpec)
            assert got[0].snapshot.turns[0].fields == {"status": "suspended"}
            assert isinstance(got[0].result, TrajectoryReplayResult)
            rates = [t.hit_rate for t in got[0].result.variants["in_place"].turns]
            assert rates == [0.9, 0.9, 0.0, 0.9, 0.0, 0.9]
            edited = s.get(Replay, ids[0])
            assert isinstance(edited.snapshot, ReplaySpec) and edited.trajectory_id is None
            s.execute(delete(Notebook).where(Notebook.id == nid))
            s.commit()
            assert s.scalar(select(func.count(Replay.id))) == 0
    finally:
        engine.dispose()


def test_rows_round_trip_on_sqlite(tmp_path):
    _rows_round_trip(f"sqlite:///{tmp_path / 'kvnotes.db'}")


def test_rows_round_trip_on_postgresql(postgres_url):
    _rows_round_trip(postgres_url)
