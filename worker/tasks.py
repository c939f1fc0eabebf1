"""Thin glue between the queue, the database and the engine: `kvnotes.run`, `kvnotes.compile_skill`,
`kvnotes.prefill`.

Each task reads what to do from the database (the broker carries only ids), claims the row, calls
the engine, and writes the outcome back. Progress, heartbeats and cancellation go through short
sessions of their own, so the web side sees them while the engine works:

- a run's row gets `stage`, `progress` and `heartbeat_at` from the engine's progress callback
  (throttled) and from a heartbeat thread (every `HEARTBEAT_S`), so a long silent stage is not
  mistaken for a dead worker;
- every such write is conditional on the run still being `running` under this worker: when the web
  has flipped it to `cancelled` (or a watchdog to `failed`) the write matches nothing and the task
  stops at the next progress point;
- a message delivered again (acks_late: the worker that had it died) finds its run `running` under
  a dead worker, or `failed` by the watchdog, and restarts it cleanly (partial results deleted).

Failures always end as a `failed` row with a sentence a person can act on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from app.db import get_sessionmaker
from app.models import Notebook, Run, RunResult, Skill
from app.services.watchdog import WORKER_LOST, reap_stale_runs
from app.settings import get_settings
from worker.celery_app import app, heartbeat_max_age, task_time_limit
from worker.engine import Engine, EngineError, Field, Notes, Placement, Question, Report, load
from worker.engine.store import KVStore

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0  # a live run's heartbeat period; the watchdog's max age is many of these
PROGRESS_EVERY_S = 0.25  # at most this often a progress write (stage changes always write)
ROW_WAIT_S = 10.0  # how long to wait for a row the web process has not committed yet

_store: KVStore | None = None


class _Stop(Exception):
    """The run was cancelled (or reaped) while it ran: stop without writing a result."""


# ---- process singletons ------------------------------------------------------------------------


def get_store() -> KVStore:
    """The process's KV store under `<data>/kv`."""
    global _store
    if _store is None:
        _store = KVStore(get_settings().data_dir / "kv")
    return _store


def get_engine(alias: str) -> Engine:
    """The engine for `alias`, loaded once per process (the engine caches it) with the store set."""
    return load(alias, device=os.environ.get("KVNOTES_DEVICE") or None, store=get_store())


def _session() -> Session:
    return get_sessionmaker()()


def _now() -> datetime:
    return datetime.now(UTC)


def _ms_between(a: datetime | None, b: datetime) -> float:
    if a is None:
        return 0.0
    if a.tzinfo is None:
        a = a.replace(tzinfo=UTC)
    return (b - a).total_seconds() * 1000


def _wait_for(model: type, row_id: int) -> bool:
    """True once the row exists: the web commits after the broker took the message, so a fast
    worker can see the message before the row."""
    deadline = time.monotonic() + ROW_WAIT_S
    while True:
        with _session() as s:
            if s.get(model, row_id) is not None:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def reap_own_runs(hostname: str) -> list[int]:
    """At worker start: runs still `running` under this worker's name are from its previous life."""
    with _session() as s:
        reaped = reap_stale_runs(s, _now(), heartbeat_max_age(), worker=hostname)
        s.commit()
    if reaped:
        log.warning("worker %s: marked runs %s failed (lost in a previous life)", hostname, reaped)
    return reaped


# ---- human messages ----------------------------------------------------------------------------


def describe_failure(exc: BaseException, device: str, stage: str) -> str:
    """One line a person can act on."""
    if isinstance(exc, EngineError):
        return str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return (
            f"out of memory on {device} during {stage}: try fewer strategies, a shorter document "
            "or a smaller model"
        )
    if isinstance(exc, SoftTimeLimitExceeded):
        return f"stopped after the time limit of {task_time_limit()} s during {stage}"
    return f"worker error: {type(exc).__name__}: {exc}"


# ---- the run's row -----------------------------------------------------------------------------


def _claim(run_id: int, hostname: str, task_id: str) -> dict[str, Any] | None:
    """Mark the run `running` under this worker and return its snapshot, or None to skip it.

    Restarts (deleting partial results) a run a dead worker left `running` or the watchdog
    failed; skips a run that finished, was cancelled, or is alive on another worker."""
    with _session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None:
            return None
        heartbeat = run.heartbeat_at or run.started_at
        age_s = _ms_between(heartbeat, _now()) / 1000 if heartbeat else float("inf")
        dead_owner = run.worker == hostname or age_s > heartbeat_max_age()
        restart = (run.status == "running" and dead_owner) or (
            run.status == "failed" and run.error == WORKER_LOST
        )
        if run.status != "queued" and not restart:
            log.info("run %s is %s (worker %s): not running it again", run_id, run.status, run.worker)
            return None
        if restart:
            log.warning("run %s: restarting after its worker %s was lost", run_id, run.worker)
            s.execute(delete(RunResult).where(RunResult.run_id == run_id))
        now = _now()
        run.status, run.stage, run.progress, run.error = "running", "starting", 0.0, None
        run.worker, run.task_id = hostname, task_id or run.task_id
        run.started_at, run.heartbeat_at, run.finished_at = now, now, None
        run.timings = {"queue_wait_ms": round(_ms_between(run.created_at, now), 1)}
        snapshot = dict(run.snapshot)
        s.commit()
        return snapshot


class RunReporter:
    """Writes stage/progress/heartbeat to a running run's row and notices cancellation."""

    def __init__(self, run_id: int, hostname: str) -> None:
        self.run_id, self.hostname = run_id, hostname
        self.stage = "starting"
        self._last_write = 0.0
        self._started = time.monotonic()
        self._stopped = threading.Event()
        self._lost = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat_loop, daemon=True, name=f"heartbeat-{run_id}")

    def __enter__(self) -> RunReporter:
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._beat.join(timeout=HEARTBEAT_S)

    def _write(self, **values: Any) -> bool:
        """Update the row if it is still ours and running; False when it is not any more."""
        with _session() as s:
            result = s.execute(
                update(Run)
                .where(Run.id == self.run_id, Run.status == "running", Run.worker == self.hostname)
                .values(heartbeat_at=_now(), **values)
            )
            s.commit()
            return result.rowcount == 1

    def _heartbeat_loop(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                if not self._write():
                    self._lost.set()
            except Exception:  # a busy database must not kill the run; the next beat retries
                log.exception("heartbeat of run %s failed", self.run_id)

    def progress(self, stage: str, fraction: float) -> None:
        """The engine's progress callback: write (throttled), and stop if the run was cancelled or
        ran past the time limit (the solo pool does not enforce Celery's time limits itself)."""
        if self._lost.is_set():
            raise _Stop
        if time.monotonic() - self._started > task_time_limit():
            raise SoftTimeLimitExceeded()
        now = time.monotonic()
        if stage == self.stage and now - self._last_write < PROGRESS_EVERY_S:
            return
        self.stage, self._last_write = stage, now
        if not self._write(stage=stage[:64], progress=float(min(max(fraction, 0.0), 1.0))):
            raise _Stop


def _engine_inputs(eng: Engine, snapshot: dict[str, Any]) -> dict[str, Any]:
    """The engine's arguments from a run snapshot; a document over the token limit is refused."""
    limit = get_settings().max_document_tokens
    n_tokens = len(eng.tokenize_document(snapshot["document"])[0])
    if n_tokens > limit:
        raise EngineError(
            f"the document is {n_tokens} tokens on {eng.info.alias}; the limit is {limit} "
            "(KVNOTES_MAX_DOCUMENT_TOKENS)"
        )
    q = snapshot.get("question") or {}
    return {
        "document": snapshot["document"],
        "fields": [
            Field(f["start"], f["end"], f["new"], f.get("label") or "") for f in snapshot.get("fields", [])
        ],
        "question": Question(q.get("text", ""), tuple(q.get("choices") or ()), bool(q.get("cot", False))),
        "strategies": list(snapshot.get("strategies") or []),
        "errata": list(snapshot["errata"]) if snapshot.get("errata") else None,
        "placements": [
            Placement(
                text=p["text"], at=p.get("position"), notes=skill_notes(eng, p.get("skill_id"), p["text"])
            )
            for p in snapshot.get("placements", [])
        ],
    }


def _result_rows(run_id: int, report: Report) -> list[RunResult]:
    rows = []
    for name, result in report.strategies.items():
        row = RunResult(run_id=run_id, strategy=name, **asdict(result))
        att = report.attention.get(name)
        if att is not None:
            weights = np.ascontiguousarray(att.weights, dtype=np.float16)  # [layers, heads, T]
            row.attention = weights.tobytes()
            row.attention_shape = list(weights.shape)
            row.tokens = [asdict(t) for t in att.tokens]
        rows.append(row)
    return rows


def _finish(run_id: int, hostname: str, **values: Any) -> bool:
    """Final write, only if the run is still ours and running (not cancelled meanwhile)."""
    with _session() as s:
        result = s.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == "running", Run.worker == hostname)
            .values(finished_at=_now(), heartbeat_at=_now(), **values)
        )
        s.commit()
        return result.rowcount == 1


def _save_report(run_id: int, hostname: str, report: Report, timings: dict[str, float]) -> bool:
    """Results and `succeeded` in one transaction; nothing is written if the run was cancelled."""
    with _session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None or run.status != "running" or run.worker != hostname:
            return False
        s.execute(delete(RunResult).where(RunResult.run_id == run_id))
        s.add_all(_result_rows(run_id, report))
        run.status, run.stage, run.progress, run.error = "succeeded", "done", 1.0, None
        run.finished_at = run.heartbeat_at = _now()
        run.timings = {**(run.timings or {}), **timings}
        s.commit()
        return True


def _stopped(run_id: int) -> None:
    """After a cancellation: drop partial results, stamp the end; the status stays as the web set
    it. A run that was taken from us otherwise (reaped, restarted elsewhere) is left alone."""
    with _session() as s:
        run = s.get(Run, run_id)
        if run is not None and run.status == "cancelled":
            s.execute(delete(RunResult).where(RunResult.run_id == run_id))
            run.stage, run.finished_at = "cancelled", run.finished_at or _now()
        s.commit()


# ---- tasks -------------------------------------------------------------------------------------


@app.task(name="kvnotes.run", bind=True)
def run(self, run_id: int) -> dict[str, Any]:
    """Run a run: every strategy of its snapshot, compared against recompute, results stored."""
    hostname = self.request.hostname or "unknown"
    if not _wait_for(Run, run_id):
        log.error("run %s does not exist", run_id)
        return {"run_id": run_id, "status": "missing"}
    snapshot = _claim(run_id, hostname, self.request.id)
    if snapshot is None:
        return {"run_id": run_id, "status": "skipped"}
    t0 = time.perf_counter()
    reporter = RunReporter(run_id, hostname)
    device = "?"
    try:
        with reporter:
            reporter.progress("loading model", 0.0)
            eng = get_engine(snapshot["model"])
            device = str(eng.device)
            t_load = time.perf_counter()
            report = eng.run(**_engine_inputs(eng, snapshot), attention=True, progress=reporter.progress)
            t_engine = time.perf_counter()
        timings = {
            "load_ms": round((t_load - t0) * 1000, 1),
            "engine_ms": round((t_engine - t_load) * 1000, 1),
        }
        if _save_report(run_id, hostname, report, timings):
            log.info("run %s succeeded in %.0f ms", run_id, (time.perf_counter() - t0) * 1000)
            return {"run_id": run_id, "status": "succeeded"}
        _stopped(run_id)
        return {"run_id": run_id, "status": "cancelled"}
    except _Stop:
        log.info("run %s stopped: cancelled", run_id)
        _stopped(run_id)
        return {"run_id": run_id, "status": "cancelled"}
    except BaseException as exc:
        if not isinstance(exc, EngineError):
            log.exception("run %s failed during %s", run_id, reporter.stage)
        message = describe_failure(exc, device, reporter.stage)
        _finish(run_id, hostname, status="failed", stage="failed", error=message)
        if not isinstance(exc, Exception):
            raise  # SystemExit / KeyboardInterrupt: let the worker shut down
        return {"run_id": run_id, "status": "failed", "error": message}


def _skill_extra(notes: Notes) -> dict[str, str]:
    return {"segments": json.dumps(notes.segments), "first_position": str(notes.first_position)}


def skill_notes(eng: Engine, skill_id: int | None, text: str) -> Notes | None:
    """A compiled skill's notes from the KV store, or None (the engine then compiles it) when the
    skill has no stored key, the model differs, or its entry is missing or corrupt."""
    if skill_id is None:
        return None
    with _session() as s:
        skill = s.get(Skill, skill_id)
        key = skill.store_key if skill is not None and skill.text == text else None
    entry = get_store().get_entry(key) if key else None
    if entry is None or "segments" not in entry.extra:
        return None
    n = len(entry.token_ids)
    return Notes(
        token_ids=entry.token_ids,
        offsets=[(-1, -1)] * n,
        segments=json.loads(entry.extra["segments"]),
        layers=[(k.unsqueeze(0).to(eng.device), v.unsqueeze(0).to(eng.device)) for k, v in entry.layers],
        text=text,
        first_position=int(entry.extra.get("first_position", "0")),
        rope=eng.rope,
    )


def _set_skill(skill_id: int, **values: Any) -> None:
    with _session() as s:
        s.execute(update(Skill).where(Skill.id == skill_id).values(updated_at=_now(), **values))
        s.commit()


@app.task(name="kvnotes.compile_skill", bind=True)
def compile_skill(self, skill_id: int) -> dict[str, Any]:
    """Prefill a skill once and keep its notes in the KV store under `skills.store_key`."""
    if not _wait_for(Skill, skill_id):
        return {"skill_id": skill_id, "status": "missing"}
    with _session() as s:
        skill = s.get(Skill, skill_id)
        text, model = skill.text, skill.model
    _set_skill(skill_id, status="compiling", progress=0.0, error=None, task_id=self.request.id)
    device, stage = "?", "loading model"
    try:
        eng = get_engine(model)
        device, stage = str(eng.device), "compiling"
        t0 = time.perf_counter()
        notes = eng.compile_skill(text)
        compile_ms = (time.perf_counter() - t0) * 1000
        layers = [(k[0], v[0]) for k, v in notes.layers]  # drop the batch dim
        key = get_store().put(eng.model_key, notes.token_ids, layers, extra=_skill_extra(notes))
        _set_skill(
            skill_id,
            status="compiled",
            progress=1.0,
            token_count=notes.n_tokens,
            store_key=key,
            compile_ms=round(compile_ms, 2),
        )
        return {"skill_id": skill_id, "status": "compiled", "store_key": key}
    except Exception as exc:
        if not isinstance(exc, EngineError):
            log.exception("compiling skill %s failed", skill_id)
        message = describe_failure(exc, device, stage)
        _set_skill(skill_id, status="failed", error=message)
        return {"skill_id": skill_id, "status": "failed", "error": message}


@app.task(name="kvnotes.prefill", bind=True)
def prefill(self, notebook_id: int) -> dict[str, Any]:
    """Warm the KV store with a notebook's document, so its next run starts from stored blocks."""
    if not _wait_for(Notebook, notebook_id):
        return {"notebook_id": notebook_id, "status": "missing"}
    with _session() as s:
        notebook = s.get(Notebook, notebook_id)
        document, model = notebook.document, notebook.model
    t0 = time.perf_counter()
    try:
        notes = get_engine(model).prefill(document)
    except EngineError as exc:
        return {"notebook_id": notebook_id, "status": "failed", "error": str(exc)}
    return {
        "notebook_id": notebook_id,
        "status": "done",
        "tokens": notes.n_tokens,
        "ms": round((time.perf_counter() - t0) * 1000, 1),
        "store": get_store().stats(),
    }
