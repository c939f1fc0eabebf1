"""The Celery tasks, thin glue between the queue, the database and the engine: `kvnotes.run`,
`kvnotes.compile_skill`, and what a worker does when it starts.

Each task reads what to do from the database (the broker carries only ids), claims the row, calls
the engine, and writes the outcome back (`worker.run_rows`). Failures always end as a `failed` row
with a sentence a person can act on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from celery.signals import worker_ready
from sqlalchemy import update

from data.models import Run, RunStatus, Skill
from data.queue import queue_for
from data.settings import get_settings
from worker import jobs, presence, run_rows, sweep_rows
from worker.celery_app import app
from worker.engine import EngineError
from worker.mapping import (
    mechanism_record,
    notes_map_record,
    result_rows,
    run_request,
    store_owner,
    store_reuse_record,
)
from worker.runtime import convert_bundled, describe_failure, get_engine, loading_stage

log = logging.getLogger(__name__)


@app.task(name="kvnotes.run", bind=True)
def run(self, run_id: int) -> dict[str, Any]:
    """Run a run: every strategy of its snapshot, compared against recompute, results stored. The
    message runs only the run that holds its token (the task id); any other message is dropped at
    once (its run was deleted, or never saved)."""
    hostname = self.request.hostname or "unknown"
    # through a storage fault (read-only, full): the run stays queued, the message is not used up
    snapshot = jobs.claim_or_retry(self, lambda: run_rows.claim(run_id, hostname, self.request.id), "run",
                                   run_id=run_id)
    if snapshot is None:  # a sweep's edit cancelled while queued: its sweep may have ended with it
        sweep_rows.refresh(run_rows.sweep_of(run_id))
        return {"run_id": run_id, "status": "skipped"}
    t0 = time.perf_counter()
    reporter = run_rows.RunReporter(run_id, hostname)
    device = "?"
    try:
        with reporter:
            reporter.progress(loading_stage(snapshot.model), 0.0)
            eng = get_engine(snapshot.model, say=lambda stage: reporter.progress(stage, 0.0))
            device = str(eng.device)
            t_load = time.perf_counter()
            with eng.scoped(store_owner(snapshot.user)):  # KVNOTES_STORE_SCOPE=user: this user's notes
                request, notes = run_request(eng, snapshot), None
                if snapshot.sweep_id is not None:  # a sweep's edit: its document's notes are the sweep's
                    reporter.progress("prefill", 0.01)
                    notes = sweep_rows.sweep_notes(eng, snapshot)
                    # statistics only: no attention maps; timed in paired rounds only on the sweep's
                    # timed sample, which also checks the decision-only reference against recompute
                    request = replace(request, attention=False, timing=snapshot.timed,
                                      check_reference=snapshot.timed)
                report = eng.run(request, notes=notes, progress=reporter.progress)
            t_engine = time.perf_counter()
        timings = {"load_ms": round((t_load - t0) * 1000, 1),
                   "engine_ms": round((t_engine - t_load) * 1000, 1), "timed": float(report.timed)}
        if report.exact_reference_kl is not None:
            timings["exact_reference_kl"] = report.exact_reference_kl
        notes_map = notes_map_record(report.attribution)
        if run_rows.succeed(run_id, hostname, result_rows(run_id, report), timings, notes_map,
                            dtype=report.dtype, device=report.device,
                            mechanism=mechanism_record(report.mechanism),
                            store_reuse=store_reuse_record(report.store_reuse)):
            log.info("run succeeded",
                     extra={"run_id": run_id, "duration_ms": round((time.perf_counter() - t0) * 1000)})
            sweep_rows.refresh(snapshot.sweep_id)
            return {"run_id": run_id, "status": RunStatus.SUCCEEDED}
        won = jobs.lost(Run, run_id, RunStatus.SUCCEEDED)  # cancelled (or reaped) after its last step
        run_rows.stopped(run_id)
        sweep_rows.refresh(snapshot.sweep_id)
        return {"run_id": run_id, "status": won}
    except run_rows.PastDeadline as exc:
        log.warning("run stopped: past its deadline", extra={"run_id": run_id, "stage": reporter.stage})
        if not run_rows.fail(run_id, hostname, str(exc)):
            won = jobs.lost(Run, run_id, RunStatus.FAILED)
            sweep_rows.refresh(snapshot.sweep_id)
            return {"run_id": run_id, "status": won}
        sweep_rows.refresh(snapshot.sweep_id)
        return {"run_id": run_id, "status": RunStatus.FAILED, "error": str(exc)}
    except run_rows.Stop:
        log.info("run stopped: cancelled", extra={"run_id": run_id})
        run_rows.stopped(run_id)
        sweep_rows.refresh(snapshot.sweep_id)
        return {"run_id": run_id, "status": RunStatus.CANCELLED}
    except BaseException as exc:
        if not isinstance(exc, EngineError):
            log.exception("run failed", extra={"run_id": run_id, "stage": reporter.stage})
        message = describe_failure(exc, device, reporter.stage)
        written = run_rows.fail(run_id, hostname, message)
        won = RunStatus.FAILED if written else jobs.lost(Run, run_id, RunStatus.FAILED)
        sweep_rows.refresh(snapshot.sweep_id)
        if not isinstance(exc, Exception):
            raise  # SystemExit / KeyboardInterrupt: let the worker shut down
        return {"run_id": run_id, "status": won, **({"error": message} if written else {})}


def _set_skill(skill_id: int, **values: Any) -> None:
    with run_rows.session() as s:
        s.execute(update(Skill).where(Skill.id == skill_id).values(updated_at=run_rows.now(), **values))
        s.commit()


@app.task(name="kvnotes.compile_skill", bind=True)
def compile_skill(self, skill_id: int) -> dict[str, Any]:
    """Prefill a skill once and keep its notes in the KV store under `skills.store_key`."""
    if not run_rows.wait_for(Skill, skill_id):
        return {"skill_id": skill_id, "status": "missing"}
    with run_rows.session() as s:
        skill = s.get(Skill, skill_id)
        text, model, owner = skill.text, skill.model, skill.created_by
    _set_skill(skill_id, status="compiling", progress=0.0, error=None, task_id=self.request.id)
    device, stage = "?", "loading model"
    try:
        eng = get_engine(model)
        device, stage = str(eng.device), "compiling"
        t0 = time.perf_counter()
        with eng.scoped(store_owner(owner)):
            notes = eng.compile_skill(text)
            compile_ms = (time.perf_counter() - t0) * 1000
            key = eng.save_skill(notes)
        _set_skill(skill_id, status="compiled", progress=1.0, token_count=notes.n_tokens, store_key=key,
                   compile_ms=round(compile_ms, 2))
        return {"skill_id": skill_id, "status": "compiled", "store_key": key}
    except Exception as exc:
        if not isinstance(exc, EngineError):
            log.exception("compiling a skill failed", extra={"skill_id": skill_id})
        message = describe_failure(exc, device, stage)
        _set_skill(skill_id, status="failed", error=message)
        return {"skill_id": skill_id, "status": "failed", "error": message}


@worker_ready.connect
def _on_worker_ready(sender=None, **_kwargs) -> None:
    """At start: fail the runs this worker's previous life left `running`, then load the default
    model once (if this worker serves it), so the first task does not pay for loading, and convert
    (without loading) every other bundled model it serves, so their first runs do not pay for the
    conversion either; health says "starting: converting gemma3-270m (first use): k of n tensors"
    until then."""
    hostname = getattr(sender, "hostname", None) or "unknown"
    queues = [q.name for q in sender.task_consumer.queues] if sender is not None else []
    if presence.start(hostname, queues):  # a duplicate name must not fail a live worker's runs
        try:
            run_rows.reap_own_runs(hostname)
        except Exception:  # storage down: the watchdog reaps them later; load and say ready all the same
            log.exception("could not fail the runs a previous life left running", extra={"worker": hostname})
    default_queue = queue_for(get_settings().default_model)
    preload = [q for q in queues if q == default_queue] or [q for q in queues if q.startswith("model.")][:1]
    for name in preload:
        presence.starting(loading_stage(name.removeprefix("model.")))  # health names it until ready
        try:
            get_engine(name.removeprefix("model."), say=presence.starting).warm_up()
        except Exception:  # a task on this queue will report the error on its run
            log.exception("could not preload the model of a queue", extra={"queue": name})
    # every other bundled model this worker serves is converted now (not loaded), before health says
    # ok: its first run then loads in seconds instead of converting for minutes
    convert_bundled([q.removeprefix("model.") for q in queues if q.startswith("model.")], presence.starting)
    presence.ready()
    log.info("worker ready", extra={"worker": hostname, "queues": ",".join(queues)})
