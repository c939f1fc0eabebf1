"""A worker lost mid-sweep, for real (issue 23): a served kvnotes on the embedded broker (which never
delivers a lost message again) and real Celery worker processes on the tiny llama, killed with
SIGKILL while an edit runs.

- Lost once: the interrupted edit is queued again by the watchdog's retry, a new worker runs it a
  second time (attempts 2) and it succeeds; the other edits ran once each (attempts 1, one result
  per strategy, the CSV one row per edit and strategy); the sweep's API and page say the edit was
  retried; the document was prefilled once per worker that ran the sweep (2).
- Lost twice: the same edit killed again on its retry is failed with the reason, and the sweep
  finishes with the others and says so ("2 of 3 edits; 1 failed: lost twice …").

The document is ~2,000 tokens so that an edit lasts a few seconds on 2 cores, long enough to be
caught running; 3 edits per sweep, 4 worker starts in all."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.conftest import ServedApp, api_call, stop_process, until

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          + "Only accounts whose status is active may log in. " * 40)
STRATEGIES = ["recompute", "erratum"]  # and stale, which every sweep adds
WAIT_S = 240  # a worker's start (imports, the model) on a loaded 2-core machine, or a few edits


def _until(what: str, check, timeout: float = WAIT_S, every: float = 0.05):
    return until(what, check, timeout, every)


class Workers:
    """Real `celery worker` processes of the served app, started and SIGKILLed one at a time."""

    def __init__(self, server: ServedApp) -> None:
        self.server, self.procs, self.started = server, [], 0

    def start(self) -> subprocess.Popen:
        from commands.supervisor import worker_command

        self.started += 1
        name = f"lost-{self.started}"
        proc = subprocess.Popen(worker_command([MODEL], f"{name}@%h"), env=self.server.env,
                                cwd=self.server.env["PYTHONPATH"], stdout=self.server._out,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        from data.workers import Worker

        def ready() -> bool:
            with self.server.db() as s:
                row = s.scalar(select(Worker).where(Worker.name.like(f"{name}@%"), Worker.pid == proc.pid))
                return row is not None and row.starting is None and row.stopped_at is None
        _until(f"worker {name} ready", ready, every=0.25)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc, 20)


def _running_edit(server: ServedApp, sweep_id: int, attempts: int):
    """(run id, status) of an edit of the sweep that a worker is computing (past the document's
    prefill, which the sweep has counted) on its `attempts`-th attempt, or None."""
    from data.models import Run, Sweep

    with server.db() as s:
        if (s.get(Sweep, sweep_id).document_prefills or 0) < 1:
            return None
        return s.scalar(select(Run.id).where(Run.sweep_id == sweep_id, Run.status == "running",
                                             Run.attempts == attempts, Run.progress > 0.01))


def _status(server: ServedApp, run_id: int) -> str:
    from data.models import Run

    with server.db() as s:
        return s.get(Run, run_id).status


def _finished(api: str, sweep_id: int) -> dict:
    """The sweep once it has ended, read as a user would (each read runs the watchdog and retries)."""
    def ended():
        sweep = api_call(f"{api}/sweeps/{sweep_id}")
        return sweep if sweep["status"] not in ("queued", "running") else None
    return _until(f"sweep {sweep_id} to end", ended, every=1.0)


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode()


def test_a_sweep_edit_lost_with_its_worker_runs_again_once_then_fails(tmp_path: Path) -> None:
    with ServedApp(tmp_path, MODEL, worker=False) as server:
        workers = Workers(server)
        try:
            api = f"{server.url}/api"
            nb = api_call(f"{api}/notebooks", "POST",
                          {"title": "access", "model": MODEL, "text": RECORD})["id"]
            start = RECORD.index("active")
            api_call(f"{api}/notebooks/{nb}/fields", "POST",
                     {"start": start, "end": start + 6, "new_value": "suspended", "label": "status"})

            def sweep(values: list[str]) -> int:
                return api_call(f"{api}/notebooks/{nb}/sweeps", "POST",
                                {"values": {"status": values}, "question": "Can Dana log in?",
                                 "choices": ["yes", "no"], "strategies": STRATEGIES})["id"]

            # ---- lost once: it runs again on the next worker and succeeds
            first = workers.start()
            once = sweep(["suspended", "banned", "closed"])
            killed = _until("an edit running", lambda: _running_edit(server, once, attempts=1))
            workers.kill(first)
            assert _status(server, killed) == "running"  # killed mid-edit, not after it
            second = workers.start()
            done = _finished(api, once)
            page = _text(f"{server.url}/sweeps/{once}")
            rows = list(csv.DictReader(io.StringIO(_text(f"{server.url}/sweeps/{once}/export.csv"))))

            assert (done["status"], done["edits_done"], done["edits_failed"], done["edits_retried"]) == \
                ("succeeded", 3, 0, 1)
            assert done["error"] is None and done["document_prefills"] == 2  # once per worker
            edits = {e["run_id"]: e for e in done["edits"]}
            assert (edits[killed]["status"], edits[killed]["attempts"]) == ("succeeded", 2)
            assert edits[killed]["retried"] == "retried once: its first worker was lost"
            assert sorted(e["attempts"] for e in edits.values()) == [1, 1, 2]
            assert all(set(e["results"]) == {"recompute", "erratum", "stale"} for e in edits.values())
            assert len(rows) == 3 * 3 and {r["attempts"] for r in rows if r["run_id"] == str(killed)} == {"2"}
            assert 'data-retried="2"' in page and "1 retried after its worker was lost" in page
            assert api_call(f"{api}/runs/{killed}")["worker"].startswith("lost-2@")

            # ---- lost twice: failed with the reason; the sweep finishes with the other two
            twice = sweep(["frozen", "locked", "expired"])
            lost = _until("an edit running", lambda: _running_edit(server, twice, attempts=1))
            workers.kill(second)
            assert _status(server, lost) == "running"
            third = workers.start()

            def retried() -> bool:
                api_call(f"{api}/sweeps/{twice}")  # a reader: the watchdog, then the retry
                return _running_edit(server, twice, attempts=2) == lost
            _until("the lost edit running again", retried, every=0.05)
            workers.kill(third)
            assert _status(server, lost) == "running"
            workers.start()
            done = _finished(api, twice)
            page = _text(f"{server.url}/sweeps/{twice}")
        finally:
            workers.stop()
    assert (done["status"], done["edits_done"], done["edits_failed"]) == ("succeeded", 3, 1)
    edits = {e["run_id"]: e for e in done["edits"]}
    assert (edits[lost]["status"], edits[lost]["attempts"]) == ("failed", 2)
    reason = "lost twice (retried once after its worker was lost): worker lost while running"
    assert edits[lost]["error"] == reason and edits[lost]["retried"] == "retried once, lost again"
    assert sorted((e["status"], e["attempts"]) for e in edits.values() if e["run_id"] != lost) == \
        [("succeeded", 1), ("succeeded", 1)]
    assert done["error"] == f"2 of 3 edits; 1 failed: {reason}. The sweep reports the 2 that finished"
    assert done["strategies"]["recompute"]["determined"] == 2  # the statistics are the two that finished
    assert "2 of 3 edits; 1 failed: lost twice" in page and "3 of 3 edits" in page
