"""The tasks through a REAL `celery worker` process, on the embedded SQLite broker and on Redis.

One worker per broker for the module (they take seconds to start and stop): a run enqueued the way
the web enqueues it moves its progress and ends with the engine's own numbers; a skill compiles
into the KV store; and a worker SIGKILLed in the middle of a run leaves the run failed with "worker
lost" — never stuck `running`, never restarted by the broker's redelivery.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import applied, kvnotes_env
from tests.conftest import until as wait_for
from vocabulary import STRATEGIES

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
REDIS_URL = "redis://127.0.0.1:6379/11"  # a database of its own: the tests delete their keys there
START_TIMEOUT_S = 60.0
RECORD = "The customer record: name Alice, age 31, status active. Only active accounts may log in. "


def _redis_reachable() -> str | None:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
        return None
    except Exception as exc:
        return f"Redis at {REDIS_URL} unreachable: {exc}"


@dataclass
class Worker:
    """A real worker subprocess and the environment it shares with this test process."""

    broker: str
    data: Path
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    starts: list[float] = field(default_factory=list)

    def start(self) -> None:
        from commands.serve import worker_command

        log = self.log_path.open("ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            worker_command([MODEL]),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
        )
        ready_lines = self.log_path.read_text(errors="replace").count(" ready.")
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.log_path.read_text(errors="replace").count(" ready.") <= ready_lines:
            assert self.proc.poll() is None, f"worker exited:\n{self.log_text()}"
            assert time.monotonic() < deadline, f"worker not ready in {START_TIMEOUT_S} s:\n{self.log_text()}"
            time.sleep(0.1)
        self.starts.append(time.perf_counter() - t0)

    def stop(self) -> None:
        from commands.serve import stop_worker

        if self.proc is not None:
            stop_worker(self.proc, timeout=15)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def worker(request, tmp_path_factory) -> Iterator[Worker]:
    broker = request.param
    data = tmp_path_factory.mktemp(f"worker-{broker}")
    if broker == "redis":
        reason = _redis_reachable()
        if reason:
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
        import redis

        r = redis.Redis.from_url(REDIS_URL)
        r.delete(f"model.{MODEL}", "unacked", "unacked_index", "unacked_mutex")
    env = kvnotes_env(data, REDIS_URL if broker == "redis" else None, KVNOTES_DEFAULT_MODEL=MODEL,
                      KVNOTES_VISIBILITY_TIMEOUT="6", KVNOTES_DEVICE="cpu")
    with applied(env):
        from data.migrate import upgrade_to_head

        upgrade_to_head()
        w = Worker(broker, data, {**os.environ, **env}, data / "worker.log")
        w.start()
        yield w
        w.stop()


# ---- helpers -----------------------------------------------------------------------------------


def _make_notebook(document: str, choices=("yes", "no")) -> tuple[int, int]:
    from data.db import get_sessionmaker
    from data.models import Field, Notebook, Question

    i = document.index("active")
    with get_sessionmaker()() as s:
        nb = Notebook(title="t", model=MODEL, document=document)
        nb.fields.append(Field(start=i, end=i + 6, old_value="active", new_value="banned", label="status"))
        nb.questions.append(Question(text="Can she log in?", choices=list(choices), cot=False))
        s.add(nb)
        s.commit()
        return nb.id, nb.questions[-1].id


def _start_run(notebook_id: int, strategies: list[str]) -> int:
    from app.services.runs import start_run
    from data.db import get_sessionmaker
    from data.models import Notebook

    with get_sessionmaker()() as s:
        nb = s.get(Notebook, notebook_id)
        return start_run(s, nb, nb.question, strategies).id


def _poll_run(
    run_id: int, until, timeout: float, every: float = 0.05
) -> tuple[object, list[tuple[str, float]]]:
    """Poll the run's row until `until(run)`; return it and the (stage, progress) values seen."""
    from data.db import get_sessionmaker
    from data.models import Run

    seen: list[tuple[str, float]] = []
    deadline = time.monotonic() + timeout
    while True:
        with get_sessionmaker()() as s:
            run = s.get(Run, run_id)
            if not seen or seen[-1] != (run.stage, run.progress):
                seen.append((run.stage, run.progress))
            if until(run):
                run.results  # noqa: B018 — load while the session is open
                return run, seen
        assert time.monotonic() < deadline, f"run {run_id} still {run.status} ({run.stage}) after {timeout} s"
        time.sleep(every)


def _finished(run) -> bool:
    return run.status in ("succeeded", "failed", "cancelled")


# ---- tests -------------------------------------------------------------------------------------


def test_run_through_the_queue_equals_the_direct_engine_call(worker: Worker) -> None:
    from worker.engine import Field, Question, RunRequest, load
    from worker.engine.engine import no_store

    document = RECORD * 8 + f"({worker.broker} run)"
    strategies = list(STRATEGIES)
    notebook_id, _ = _make_notebook(document)
    t0 = time.perf_counter()
    run_id = _start_run(notebook_id, strategies)
    run, seen = _poll_run(run_id, _finished, timeout=60)
    queue_s = time.perf_counter() - t0
    assert run.status == "succeeded", run.error
    assert re.fullmatch(rf"kvnotes-{MODEL}-[0-9a-f]{{6}}@.+", run.worker), run.worker  # unique per start
    progresses = [p for _, p in seen]
    assert progresses == sorted(progresses) and progresses[-1] == 1.0
    assert any(0 < p < 1 for p in progresses), seen  # we saw it in the middle, not only the ends
    assert {"queue_wait_ms", "load_ms", "engine_ms"} <= set(run.timings)
    assert (run.dtype, run.device) == ("float32", "cpu")  # what the worker computed in, as its report says

    eng = load(MODEL, device="cpu")
    i = document.index("active")
    t1 = time.perf_counter()
    with no_store(eng):
        direct = eng.run(RunRequest(
            document=document,
            fields=(Field(i, i + 6, "banned", "status"),),
            question=Question("Can she log in?", ("yes", "no")),
            strategies=tuple(strategies),
            attention=True,
        ))
    direct_s = time.perf_counter() - t1
    stored = {r.strategy: r for r in run.results}
    assert set(stored) == set(direct.strategies)
    for name, want in direct.strategies.items():
        got = stored[name]
        assert got.decision == want.decision, name
        assert got.kl_to_recompute == pytest.approx(want.kl_to_recompute, abs=1e-5), name
        assert got.choice_probs == pytest.approx(want.choice_probs, abs=1e-5), name
        assert got.decision_matches_recompute == want.decision_matches_recompute, name
        layers, heads, t = got.attention_shape
        assert list(direct.attention[name].weights.shape) == [layers, heads, t]
        assert len(got.tokens) == t
    print(
        f"\n[{worker.broker}] queue round trip {queue_s * 1000:.0f} ms (engine in worker "
        f"{run.timings['engine_ms']:.0f} ms, waited in queue {run.timings['queue_wait_ms']:.0f} ms); "
        f"direct engine call {direct_s * 1000:.0f} ms; worker start {worker.starts[-1]:.1f} s"
    )


def test_compile_skill_stores_its_notes_and_a_run_splices_them(worker: Worker) -> None:
    from data.db import get_sessionmaker
    from data.models import Placement, Skill
    from data.queue import enqueue_compile
    from data.settings import get_settings
    from worker.engine.store import KVStore

    with get_sessionmaker()() as s:
        skill = Skill(name="policy", text="Policy: banned accounts may never log in.", model=MODEL)
        s.add(skill)
        s.commit()
        skill.task_id = enqueue_compile(skill)
        s.commit()
        skill_id = skill.id
    deadline = time.monotonic() + 30
    while True:
        with get_sessionmaker()() as s:
            skill = s.get(Skill, skill_id)
            if skill.status in ("compiled", "failed") or time.monotonic() > deadline:
                break
        time.sleep(0.05)
    assert skill.status == "compiled", skill.error
    assert skill.token_count > 10 and skill.compile_ms > 0
    stored = KVStore(get_settings().data_dir / "kv").get_entry(skill.store_key)
    assert stored is not None and len(stored.token_ids) == skill.token_count

    notebook_id, _ = _make_notebook(RECORD * 2 + f"({worker.broker} skill)")
    with get_sessionmaker()() as s:
        s.add(Placement(notebook_id=notebook_id, skill_id=skill_id, position=None))
        s.commit()
    run, _ = _poll_run(_start_run(notebook_id, ["recompute", "stale"]), _finished, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.snapshot.placements[0].skill_id == skill_id


def test_bad_input_fails_the_run_with_the_engines_own_message(worker: Worker) -> None:
    from data.db import get_sessionmaker
    from data.models import Run
    from data.queue import enqueue_run

    snapshot = {
        "model": MODEL,
        "document": "short",
        "fields": [{"start": 2, "end": 99, "old": "ort", "new": "x", "label": "tail"}],
        "errata": [],
        "placements": [],
        "question": {"text": "What is it?", "choices": ["a", "b"], "cot": False},
        "strategies": ["recompute", "stale"],
    }
    with get_sessionmaker()() as s:
        run = Run(snapshot=snapshot, strategies=snapshot["strategies"], status="queued", timings={})
        s.add(run)
        s.commit()
        run.task_id = enqueue_run(run)
        s.commit()
        run_id = run.id
    run, _ = _poll_run(run_id, _finished, timeout=30)
    assert run.status == "failed"
    assert run.error.startswith("field tail [2, 99) is not inside the document"), run.error


def test_a_cancelled_run_stops_and_keeps_no_results(worker: Worker) -> None:
    from data.db import get_sessionmaker
    from data.models import Run

    notebook_id, _ = _make_notebook(RECORD * 60 + f"({worker.broker} cancel)")
    run_id = _start_run(notebook_id, ["recompute", "stale", "in_place", "selective"])
    _poll_run(run_id, lambda r: r.status == "running" and r.progress > 0, timeout=30, every=0.02)
    with get_sessionmaker()() as s:  # what the web's cancel does
        s.get(Run, run_id).status = "cancelled"
        s.commit()
    run, _ = _poll_run(run_id, lambda r: r.finished_at is not None, timeout=60)
    assert (run.status, run.stage) == ("cancelled", "cancelled")
    assert run.results == []


def test_a_killed_worker_never_leaves_its_run_running(worker: Worker) -> None:
    from data.watchdog import WORKER_LOST

    notebook_id, _ = _make_notebook(RECORD * 80 + f"({worker.broker} slow)")  # ~7k tokens: seconds
    run_id = _start_run(notebook_id, ["recompute", "stale", "in_place", "selective"])
    _poll_run(run_id, lambda r: r.status == "running" and r.progress > 0, timeout=30, every=0.02)
    worker.kill()
    t_kill = time.perf_counter()
    worker.start()
    # the killed worker's process is gone: the one reaper (the new worker runs it) fails its run; on
    # Redis the message acks_late hands back later holds a token the run no longer waits for, and is
    # dropped (a lost job is queued again only by the reaper, and a plain run is not)
    run, _ = _poll_run(run_id, _finished, timeout=90)
    assert (run.status, run.error) == ("failed", WORKER_LOST)
    assert run.results == []
    print(f"\n[{worker.broker}] killed mid-run → {run.status} "
          f"{time.perf_counter() - t_kill:.1f} s after the kill")


def test_a_deleted_queued_run_never_starts_or_delays_another(worker: Worker) -> None:
    """While the worker is busy: run B is queued and its notebook deleted; a stray message names run
    C's id under another token (what a reused id would meet); then C's own message. B's message is
    dropped at once (no wait for a row), the stray one never starts C, and C runs once, as itself."""
    import uuid

    from app.services.notebooks import delete_notebook
    from app.services.runs import build_snapshot
    from data.db import get_sessionmaker
    from data.models import Notebook, Run
    from data.queue import TASK_RUN, _send, enqueue_run, queue_for

    busy_nb, _ = _make_notebook(RECORD * 60 + f"({worker.broker} busy)")
    busy = _start_run(busy_nb, ["recompute", "stale", "in_place"])
    _poll_run(busy, lambda r: r.status == "running", timeout=30, every=0.02)
    deleted_nb, _ = _make_notebook(RECORD * 2 + f"({worker.broker} deleted)")
    deleted_run = _start_run(deleted_nb, ["recompute"])
    with get_sessionmaker()() as s:
        deleted_token = s.get(Run, deleted_run).task_id
        delete_notebook(s, s.get(Notebook, deleted_nb))  # on Redis this also broadcasts a revoke
    own_nb, _ = _make_notebook(RECORD * 2 + f"({worker.broker} own)")
    with get_sessionmaker()() as s:  # C's row, committed before any message names it
        nb = s.get(Notebook, own_nb)
        own = Run(notebook_id=own_nb, snapshot=build_snapshot(nb, nb.question, ["recompute", "stale"]),
                  strategies=["recompute", "stale"], status="queued", stage="queued", timings={})
        s.add(own)
        s.commit()
        stray = f"stray-{uuid.uuid4()}"
        _send(TASK_RUN, {"run_id": own.id}, queue_for(MODEL), stray)  # another token, C's id
        enqueue_run(own)
        own_id, own_token = own.id, own.task_id
    busy_run, _ = _poll_run(busy, _finished, timeout=120)
    run, _ = _poll_run(own_id, _finished, timeout=120)
    assert run.status == "succeeded" and run.task_id == own_token, (run.status, run.error)
    # the worker commits the row, then logs: read the log once C's line is there (or give up)
    done = f'msg="run succeeded" run_id={own_id} '
    wait_for("C's success logged", lambda: done in worker.log_path.read_text(errors="replace"), 30)
    log = worker.log_path.read_text(errors="replace")
    # B's message is dropped either by the broadcast revoke (Redis, when it reaches the worker
    # first) or by the missing row (always on SQLite, which has no broadcast); never run
    # the worker logs key=value lines (data.logs): the message, then the facts as fields
    gone = 'does not exist (deleted, or never saved): message dropped"'
    dropped = (f"{gone} job=run job_id={deleted_run} " in log
               or f"Discarding revoked task: kvnotes.run[{deleted_token}]" in log)
    assert dropped, f"run {deleted_run}'s message (token {deleted_token}) was not dropped"
    assert f'msg="run succeeded" run_id={deleted_run} ' not in log
    assert f"""is not the job's (another token): dropped" job=run job_id={own_id} task_id={stray} """ in log
    assert log.count(f'msg="run succeeded" run_id={own_id} ') == 1  # started once, by its own message
    with get_sessionmaker()() as s:
        assert s.get(Run, deleted_run) is None
    gap = (run.started_at - busy_run.finished_at).total_seconds()
    print(f"\n[{worker.broker}] the next run started {gap:.2f} s after the busy one ended "
          "(two dropped messages between them; a missing run used to cost a 10 s wait)")
