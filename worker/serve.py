"""`kvnotes serve` (web app + one worker, the embedded default) and `kvnotes worker` (a worker alone).

`serve` migrates the database, starts ONE `celery worker` subprocess consuming the model queues,
then runs uvicorn in this process; Ctrl-C or SIGTERM stops uvicorn, then the worker (SIGTERM: a
warm shutdown that lets the current task finish, SIGKILL after `WORKER_STOP_S`). `worker` replaces
this process with a Celery worker, so signals reach Celery directly.

Worker node names are `kvnotes-<model>@<host>` by default: stable across restarts, so a worker that
comes back finds the runs its previous life left `running` and marks them failed (see
`worker.tasks.reap_own_runs`). Two workers for one model on one host need distinct `--name`s.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading

log = logging.getLogger("kvnotes.serve")

WORKER_STOP_S = 20.0


def _models(value: str | None) -> list[str]:
    """The models a worker serves: those given, else every model the web app offers (default first)."""
    from data.settings import get_settings

    names = [m.strip() for m in (value or "").split(",") if m.strip()]
    return names or get_settings().models


def worker_command(models: list[str], name: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The `celery worker` command line for a worker consuming the queues of `models`."""
    from data.queue import queue_for

    node = name or f"kvnotes-{queue_for(models[0]).removeprefix('model.')}@%h"
    return [
        sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
        "--pool=solo", "--concurrency=1",
        "-Q", ",".join(queue_for(m) for m in models),
        "-n", node,
        f"--loglevel={loglevel}",
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


def _watch(proc: subprocess.Popen, stopping: threading.Event) -> None:
    proc.wait()
    if not stopping.is_set():
        log.error(
            "the worker exited (code %s); runs will wait in the queue until one starts", proc.returncode
        )


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def cmd_serve(args: argparse.Namespace) -> int:
    """Migrate, start the worker, serve the web app until Ctrl-C / SIGTERM, stop both."""
    import uvicorn

    from data.migrate import upgrade_to_head

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    models = _models(args.model)
    if args.model:  # the web app offers exactly what the worker serves
        from data.settings import get_settings

        os.environ["KVNOTES_DEFAULT_MODEL"] = models[0]
        os.environ["KVNOTES_MODELS"] = ",".join(models)
        get_settings.cache_clear()
    env = dict(os.environ)
    upgrade_to_head()
    proc = subprocess.Popen(worker_command(models, args.name), env=env)
    stopping = threading.Event()
    threading.Thread(target=_watch, args=(proc, stopping), daemon=True).start()
    print(
        f"kvnotes: open http://{args.host}:{args.port}/  (worker pid {proc.pid}, models {', '.join(models)})"
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler that
    # was there before it: make SIGTERM's an exception (like SIGINT's), so `finally` stops the worker.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run("app.main:app", host=args.host, port=args.port, log_level="info")
    finally:
        stopping.set()
        code = stop_worker(proc)
        log.info("worker stopped (code %s)", code)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Become a Celery worker for the given models' queues (never returns)."""
    cmd = worker_command(_models(args.model), args.name, args.loglevel)
    if args.model:
        os.environ["KVNOTES_DEFAULT_MODEL"] = _models(args.model)[0]
    if args.concurrency != 1:
        print(
            "kvnotes: a worker holds one model and runs one task at a time; start one per GPU",
            file=sys.stderr,
        )
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(sys.executable, cmd)
    return 0  # not reached


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `serve` and `worker` on the `kvnotes` command line."""
    p = subparsers.add_parser("serve", help="start the web app and one worker (migrates the database first)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--model", default=None, help="model(s) the worker serves, comma-separated (default: every model offered, KVNOTES_MODELS)"
    )
    p.add_argument("--name", default=None, help="worker node name (default kvnotes-<model>@<host>)")
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser("worker", help="start a Celery worker for one model's queue")
    p.add_argument("--model", default=None, help="model(s) to serve, comma-separated (default: settings)")
    p.add_argument("--concurrency", type=int, default=1, help="kept at 1: one model, one task at a time")
    p.add_argument("--name", default=None, help="worker node name (default kvnotes-<model>@<host>)")
    p.add_argument("--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)
