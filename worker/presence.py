"""A worker's presence in the registry (`data.workers`), and its tie to the `kvnotes serve` that
started it.

- At start (`worker_init`): when `KVNOTES_SUPERVISOR_PID` is set, ask Linux to SIGKILL this
  process when that parent dies (`data.lifeline`), and exit at once if it is already gone:
  a killed `serve` leaves no orphan worker.
- When ready (`start`, `starting` while it loads or converts its model, then `ready`): register
  under the node name, then beat every `BEAT_S` seconds from a thread (the registry row and the
  database's liveness row, `data.health.write_liveness`, that `/api/health` reads), and run the one
  reaper (`data.watchdog.reap`) every `WATCH_EVERY_S` from ANOTHER thread, on a session of short
  timeouts: a slow reap pass (a busy database, a broker that does not answer) never delays the beat,
  so this worker never looks dead to the others for it (and the reaper trusts jobs' own heartbeats,
  not the registry, anyway). Health counts the worker only once it is ready, and names what it
  still does before ("starting: converting smollm2-135m").
- A worker whose registration could not be written (a read-only database) or whose row was marked
  stopped while the database could not hear it registers again at its next beat, as it is then
  (starting or ready): a storage fault never leaves a live worker out of the registry.
- Around each task: busy / idle (idle once no task runs: a replays worker runs several in threads),
  which the reaper needs to tell a waiting message from a lost one.
- On a clean shutdown: marked stopped, so health and the watchdog know at once.

Every database write here is best effort: a database that cannot be written must not stop the
worker (the beat retries; the web side reports the database as down).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery.signals import task_postrun, task_prerun, worker_init, worker_shutdown

from data import workers
from data.db import get_sessionmaker
from data.health import write_liveness
from data.lifeline import die_with_parent
from data.settings import get_settings
from data.watchdog import reap, reaper_session

log = logging.getLogger(__name__)

BEAT_S = 5.0
WATCH_EVERY_S = 15.0

_state: dict[str, Any] = {"name": None, "queues": [], "starting": "starting",
                          "task": None, "stop": threading.Event()}
_in_flight: dict[str, int] = {}  # task id -> its run id (0: not a run); several in a replays worker
_tasks_lock = threading.Lock()


def _write(what: str, action, sessions=None) -> bool:
    """Run `action` on a session and commit; False (logged) when the database would not have it."""
    try:
        with (sessions or get_sessionmaker())() as session:
            action(session)
            session.commit()
            return True
    except Exception as exc:  # the database may be read-only or full; the worker carries on
        log.warning("worker registry: could not write",
                    extra={"doing": what, "reason": exc.__class__.__name__})
        return False


@worker_init.connect
def _on_init(**_kwargs: Any) -> None:
    die_with_parent(get_settings().supervisor_pid)


def start(name: str, queues: list[str]) -> bool:
    """Register and start beating. False when a live worker already has this name (a duplicate
    `--name`): runs under the name are then not this worker's to reap."""
    result = {"unique": True}
    _state.update(name=name, queues=list(queues), starting="starting")

    def register(session) -> None:
        result["unique"] = workers.register(session, name, queues, socket.gethostname(), os.getpid(),
                                            starting="starting")
        write_liveness(session)

    _write("register", register)
    _state["stop"].clear()
    threading.Thread(target=_beat_loop, args=(name,), daemon=True, name="kvnotes-presence").start()
    threading.Thread(target=_reaper_loop, daemon=True, name="kvnotes-reaper").start()
    if not result["unique"]:
        log.error("another live worker has this name: give each worker its own --name",
                  extra={"worker": name})
    return result["unique"]


def starting(what: str) -> None:
    """Still getting ready: `what` the worker does ("converting smollm2-135m"), which health names."""
    _state["starting"] = what
    if _state["name"]:
        _write("say it is starting", lambda s: workers.set_starting(s, _state["name"], what))


def ready() -> None:
    """The model is loaded: idle from now on (the watchdog counts idle time from here)."""
    _state["starting"] = None
    if _state["name"]:
        _write("mark idle", lambda s: workers.set_running(s, _state["name"], None))


def _beat_or_register(session, name: str) -> None:
    """Beat; with no live row to beat, register again as the worker is now (starting or ready)."""
    if not workers.beat(session, name):
        workers.register(session, name, _state["queues"], socket.gethostname(), os.getpid(),
                         starting=_state["starting"])
        if _state["starting"] is None:
            workers.set_running(session, name, _state["task"])  # busy with it, or idle from now
        log.warning("worker registry: registered again (its row was missing or marked stopped)",
                    extra={"worker": name})


def _beat_loop(name: str) -> None:
    """The registry beat and the liveness row, every `BEAT_S`: one short write, nothing else."""
    stop: threading.Event = _state["stop"]
    while not stop.wait(BEAT_S):
        _write("beat", lambda s: _beat(s, name))


def _beat(session, name: str) -> None:
    _beat_or_register(session, name)
    write_liveness(session)


def _reaper_loop() -> None:
    """The one reaper every `WATCH_EVERY_S`, apart from the beat (see the module's docstring)."""
    stop: threading.Event = _state["stop"]
    while not stop.wait(WATCH_EVERY_S):
        _write("run the reaper", _reap, sessions=reaper_session)


def _reap(session) -> None:
    reap(session)  # the one reaper: every kind of job (commits; lost jobs queued again once)
    workers.forget_old(session)


@task_prerun.connect
def _on_task_start(task_id: str | None = None, kwargs: dict | None = None, **_: Any) -> None:
    run_id = int((kwargs or {}).get("run_id", 0) or 0)
    with _tasks_lock:
        _in_flight[task_id or ""] = run_id
        _state["task"] = run_id
    if _state["name"]:
        _write("mark busy", lambda s: workers.set_running(s, _state["name"], run_id))


@task_postrun.connect
def _on_task_end(task_id: str | None = None, **_: Any) -> None:
    """Idle once no task runs (a replays worker runs several at once, in threads)."""
    with _tasks_lock:
        _in_flight.pop(task_id or "", None)
        _state["task"] = next(iter(_in_flight.values()), None)
    if _state["task"] is None:
        ready()


@worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    _state["stop"].set()
    if _state["name"]:
        _write("mark stopped", lambda s: workers.mark_stopped(s, _state["name"]))
