"""The replay through the web app and a real Celery worker: `POST /api/notebooks/{id}/replays`
checks before saving (422 naming the problem, no row), the worker's `kvnotes.replay` stores what the
server measured, and the notebook's Serving panel and the replay's permalink show the same numbers."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.serving.conftest import make_notebook

pytestmark = pytest.mark.slow


def _replays(client: httpx.Client, nid: int) -> list[dict]:
    return client.get(f"/api/notebooks/{nid}/replays").json()


def test_bad_replays_are_refused_with_the_reason_and_nothing_is_saved(served):
    with httpx.Client(base_url=served.url, timeout=120) as client:
        nid = make_notebook(client)
        dead = f"http://127.0.0.1:{free_port()}/v1"
        cases = [({"url": dead}, "url", "did not answer as vLLM does"),
                 ({"model": "gpt-4"}, "model", "model 'gpt-4' is not served"),
                 ({"variants": ["rewrite"]}, "variants", "unknown 'rewrite'"),
                 ({"rate": 0}, "rate", "greater than 0")]
        for body, field, message in cases:
            r = client.post(f"/api/notebooks/{nid}/replays", json=body)
            assert r.status_code == 422, r.text
            assert field in r.text and message in r.text, r.text
        page = client.post(f"/notebooks/{nid}/replays", data={"url": dead, "rate": "1", "concurrency": "4",
                                                             "variants": ["erratum"]})
        assert page.status_code == 422 and "did not answer as vLLM does" in page.text
        assert _replays(client, nid) == []


def test_a_replay_runs_on_the_worker_and_the_panel_shows_its_numbers(served):
    with httpx.Client(base_url=served.url, timeout=120) as client:
        nid = make_notebook(client)
        started = client.post(f"/api/notebooks/{nid}/replays",
                              json={"values": ["Madrid", "Rome"], "rate": 4,
                                    "variants": ["in_place", "erratum"]})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]
        deadline = time.monotonic() + 600
        while (replay := client.get(f"/api/replays/{rid}").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, replay
            time.sleep(1)
        assert replay["status"] == "succeeded", replay["error"]
        variants = replay["result"]["variants"]
        assert list(variants) == ["in_place", "erratum"] and variants["erratum"]["requests"] == 2
        assert variants["erratum"]["prefix_hit_rate"] >= 0.6 > 0.1 >= variants["in_place"]["prefix_hit_rate"]

        panel = client.get(f"/notebooks/{nid}/serving").text
        permalink = client.get(f"/replays/{rid}").text
        for name, v in variants.items():
            rate = f"{v['prefix_hit_rate'] * 100:.1f}%"
            for html in (panel, permalink):
                row = html.split(f'data-variant="{name}"')[1].split("</tr>")[0]
                assert f'data-metric="prefix_hit_rate">{rate}<' in row
        csv = client.get(f"/replays/{rid}/export.csv").text.splitlines()
        assert csv[0] == "variant,request,value,ttft_ms,hit_rate,answer" and len(csv) == 1 + 4
        assert client.get(f"/replays/{rid}/export.json").json()["result"] == replay["result"]


def test_a_replay_cancelled_while_it_runs_sends_no_more_requests_and_keeps_nothing(served):
    with httpx.Client(base_url=served.url, timeout=120) as client:
        nid = make_notebook(client)
        values = ["Madrid", "Rome", "Lisbon"] * 8  # 24 requests per variant, 48 in all, ≥ 24 s at 2/s
        started = client.post(f"/api/notebooks/{nid}/replays",
                              json={"values": values, "rate": 2, "concurrency": 1,
                                    "variants": ["in_place", "erratum"]})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]
        deadline = time.monotonic() + 300
        while (replay := client.get(f"/api/replays/{rid}").json())["progress"] == 0:
            assert time.monotonic() < deadline and replay["status"] in ("queued", "running"), replay
            time.sleep(0.2)
        cancelled = client.post(f"/api/replays/{rid}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        said = re.compile(rf'msg="replay stopped" replay_id={rid} .*\bdone=(\d+) total=(\d+)')
        while not said.search(served.log.read_text(errors="replace")):
            assert time.monotonic() < deadline, "the worker never noticed the cancel"
            time.sleep(0.5)
        done, total = map(int, said.search(served.log.read_text(errors="replace")).groups())
        assert total == 48 and done < total, (done, total)
        final = client.get(f"/api/replays/{rid}").json()
        assert final["status"] == "cancelled" and final["result"] is None and final["error"] is None
        assert client.post(f"/api/replays/{rid}/cancel").status_code == 409
