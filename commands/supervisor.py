"""`kvnotes serve`'s workers (the model's, and the replays' thread pool) and its reaper: started,
watched, restarted with backoff, and never left behind.

The worker runs as a `celery worker` subprocess in its own process group (a Ctrl-C in the
terminal reaches `serve`, which then stops the worker cleanly) with `KVNOTES_SUPERVISOR_PID` set,
so it asks Linux to kill it when `serve` dies (`data.lifeline`): a `kill -9` of
`serve` leaves no orphan. Each start gets a fresh node name (`kvnotes-<model>-<random>@<host>`),
so a starting worker never mistakes a live worker's runs for its own.

The replays' worker (`replay_worker_command`) consumes only the replays' queue, with a pool of
`KVNOTES_REPLAY_THREADS` threads: replays are HTTP calls and never hold the model's worker.

When a worker dies, the supervisor at once marks it stopped in the registry (health answers 503
naming the models left without a worker) and fails the jobs it held ("worker lost"), then starts a
new one after a backoff: 1 s, doubling to `MAX_BACKOFF_S`, back to 1 s once a worker lived
`HEALTHY_AFTER_S`. The thread that starts workers lives as long as they do (the parent-death signal
is tied to the thread that forked). The `Reaper` runs the one reaper every `REAP_EVERY_S`.

A worker that does not come back from a step is replaced: every `SUPERVISE_S` the supervisor fails
the jobs of its worker stuck past their deadline (`data.watchdog.reap_overdue`), and once one of
them was failed so (`stuck_jobs`) it kills the worker, which is then restarted as any that died.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time

from data import workers
from data.db import get_sessionmaker, release_connections
from data.jobs import KINDS
from data.models import utcnow
from data.queue import REPLAY_QUEUE, queue_for
from data.settings import get_settings
from data.watchdog import reap, reap_overdue, reap_worker, reaper_session, stuck_jobs

log = logging.getLogger("kvnotes.serve")

WORKER_STOP_S = 20.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0
POLL_S = 0.2
REAP_EVERY_S = 15.0
SUPERVISE_S = 5.0  # how often a supervisor looks for its worker's jobs stuck past their deadline


def node_name(models: list[str], name: str | None = None) -> str:
    """The worker's node name: `name` as given (its `%h` filled in), else a fresh unique one."""
    if name:
        return name.replace("%h", socket.gethostname())
    alias = queue_for(models[0]).removeprefix("model.")  # (the replays' worker: "replays")
    return f"kvnotes-{alias}-{secrets.token_hex(3)}@{socket.gethostname()}"


def worker_command(models: list[str], name: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The `celery worker` command line for a worker consuming the queues of `models`."""
    return _celery_worker(["--pool=solo", "--concurrency=1"], [queue_for(m) for m in models],
                          node_name(models, name), loglevel)


def replay_worker_command(name: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The `celery worker` command line for the replays' worker: the replays' own queue
    (`REPLAY_QUEUE`), served by `KVNOTES_REPLAY_THREADS` threads; it loads no model."""
    threads = get_settings().replay_threads
    return _celery_worker(["--pool=threads", f"--concurrency={threads}"], [REPLAY_QUEUE],
                          node_name([REPLAY_QUEUE], name), loglevel)


def _celery_worker(pool: list[str], queues: list[str], name: str, loglevel: str) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker", *pool,
        "-Q", ",".join(queues), "-n", name, f"--loglevel={loglevel}",
        # no broadcast chatter: the SQLAlchemy broker has no fanout, and a worker owns its model
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def stop_worker(proc: subprocess.Popen, timeout: float = WORKER_STOP_S) -> int:
    """Warm shutdown (SIGTERM), then SIGKILL if the worker has not exited after `timeout` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("worker did not stop within %.0f s: killing it", timeout)
            proc.kill()
            proc.wait()
    return proc.returncode


def forget_worker(name: str) -> list[int]:
    """A worker died: mark it stopped and fail the jobs it held (a sweep's edits among them are
    queued again once, for the next worker). Returns the runs' ids. The connection is closed after
    (`serve` holds no SQLite file between such moments: `data.db`)."""
    try:
        with get_sessionmaker()() as session:
            workers.mark_stopped(session, name)
            return reap_worker(session, name, utcnow()).runs
    except Exception as exc:  # the database may be down too; the watchdog catches up later
        log.error("could not record that worker %s died: %s", name, exc.__class__.__name__)
        return []
    finally:
        release_connections()


class Reaper:
    """`kvnotes serve`'s reaper: the one reaper (`data.watchdog.reap`) every `every_s` seconds, so
    lost jobs are failed even when no worker runs (or all of them died); its connection is closed
    after each pass."""

    def __init__(self, every_s: float = REAP_EVERY_S) -> None:
        self.every_s = every_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvnotes-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s):
            try:
                with reaper_session() as session:
                    reap(session)
            except Exception as exc:  # storage down: the next pass tries again
                log.warning("reaper: could not run (%s)", exc.__class__.__name__)
            finally:
                release_connections()


class WorkerSupervisor:
    """Starts the worker for `models` (with `replays`, the replays' worker) and keeps one running
    until `stop()`."""

    def __init__(self, models: list[str], name: str | None = None, env: dict[str, str] | None = None,
                 replays: bool = False) -> None:
        self.models, self.fixed_name, self.replays = models, name, replays
        self.env = {**(env if env is not None else os.environ), "KVNOTES_SUPERVISOR_PID": str(os.getpid())}
        self.proc: subprocess.Popen | None = None
        self.name = ""
        self.starts = 0
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvnotes-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait(timeout=30)

    def stop(self) -> int | None:
        """Stop the worker (warm shutdown) and the supervision; the worker's exit code."""
        self._stopping.set()
        self._thread.join(timeout=WORKER_STOP_S + 10)
        return self.proc.returncode if self.proc is not None else None

    def _spawn(self) -> subprocess.Popen:
        command = (replay_worker_command(self.fixed_name) if self.replays
                   else worker_command(self.models, self.fixed_name))
        self.name = command[command.index("-n") + 1]
        self.starts += 1
        proc = subprocess.Popen(command, env=self.env, start_new_session=True)
        log.info("worker %s started (pid %s, start %d)", self.name, proc.pid, self.starts)
        return proc

    def _replace_if_stuck(self, since) -> None:
        """Kill the worker when a job of its was stuck in a step past its deadline (see the module's
        docstring); the loop then restarts it."""
        try:
            with reaper_session() as session:
                for kind in KINDS:
                    reap_overdue(session, kind, utcnow(), worker=self.name)
                session.commit()
                # (the replays worker's other threads serve other users: a replay's bounds free its thread)
                stuck = [] if self.replays else stuck_jobs(session, self.name, since)
        except Exception as exc:  # storage down: the next look tries again
            log.warning("supervisor: could not look for stuck jobs (%s)", exc.__class__.__name__)
            return
        finally:
            release_connections()
        if stuck and self.proc is not None and self.proc.poll() is None:
            log.error("worker %s is stuck past a job's deadline (%s): replacing it", self.name,
                      ", ".join(f"{kind} {job_id}" for kind, job_id in stuck))
            self.proc.kill()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stopping.is_set():
            self.proc = self._spawn()
            self._started.set()
            born, since, looked = time.monotonic(), utcnow(), time.monotonic()
            while self.proc.poll() is None and not self._stopping.wait(POLL_S):
                if time.monotonic() - looked >= SUPERVISE_S:
                    looked = time.monotonic()
                    self._replace_if_stuck(since)
            if self._stopping.is_set():
                code = stop_worker(self.proc)
                log.info("worker stopped (code %s)", code)
                return
            lost = forget_worker(self.name)
            backoff = 1.0 if time.monotonic() - born > HEALTHY_AFTER_S else backoff
            log.error("worker %s exited (code %s)%s; starting a new one in %.0f s",
                      self.name, self.proc.returncode, f", runs {lost} failed" if lost else "", backoff)
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF_S)
