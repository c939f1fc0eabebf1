"""`kvnotes serve` (web app + one supervised worker, the embedded default) and `kvnotes worker`
(a worker alone).

`serve` migrates the database, checks it may start (below), closes its own database connections,
starts the model's worker and the replays' worker (a small thread pool serving the replays' own
queue: replays never hold the model's worker) under `WorkerSupervisor`s (restarted with backoff when
they die; they die with `serve`) and the one reaper of lost jobs (`commands.supervisor.Reaper`,
every 15 s), then supervises the web app's processes (`commands.web`: a process that dies is replaced
at once); Ctrl-C or SIGTERM stops the web processes, then the workers (a warm shutdown, SIGKILL
after `WORKER_STOP_S`). `--no-worker` serves the web app alone (workers run elsewhere, as in
compose.yaml: `kvnotes worker` and `kvnotes worker --replays`).
`--web-workers N` (default: the machine's core count) runs N web processes on one
socket; each has its own database pool and request limiter (`KVNOTES_DB_POOL_SIZE` requests at once,
`app.api.capacity`) and its own heavy-render slots, so a crowd gets N times one process's capacity;
the run and replay caps are counted from the database's rows, so they hold across processes.
`worker` replaces this process with a Celery worker, so signals reach Celery directly.

Starting on an address other than loopback (or with `KVNOTES_AUTH=required`) needs a secret key
(`KVNOTES_SECRET_KEY`, several web processes must share it) and at least one user: otherwise
`serve` prints one line naming the fix and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

from commands.supervisor import (
    WORKER_STOP_S,
    Reaper,
    WorkerSupervisor,
    replay_worker_command,
    stop_worker,
    worker_command,
)

__all__ = ["WORKER_STOP_S", "add_commands", "cmd_serve", "cmd_worker", "replay_worker_command",
           "startup_problem", "stop_worker", "worker_command"]

log = logging.getLogger("kvnotes.serve")


def _models(value: str | None) -> list[str]:
    """The models a worker serves: those given, else every model the web app offers (default first)."""
    from data.settings import get_settings

    names = [m.strip() for m in (value or "").split(",") if m.strip()]
    return names or get_settings().models


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {number}")
    return number


def startup_problem() -> str | None:
    """Why the web app must not start with these settings (one line naming the fix), or None."""
    from data.accounts import count_users
    from data.db import get_sessionmaker
    from data.settings import get_settings
    from data.signing import MIN_KEY_CHARS, SecretKeyProblem, ensure_secret_key

    settings = get_settings()
    exposed = not settings.loopback_bind
    where = f"on {settings.bind_host}" if exposed else "with KVNOTES_AUTH=required"
    if exposed and not settings.secret_key:
        return (f"kvnotes: serving {where} needs KVNOTES_SECRET_KEY "
                f"(at least {MIN_KEY_CHARS} random characters, "
                "e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`) "
                "and a user (`kvnotes users add NAME`)")
    try:
        ensure_secret_key()
    except SecretKeyProblem as exc:
        return f"kvnotes: {exc}"
    if not exposed and settings.auth != "required":
        return None
    with get_sessionmaker()() as session:
        if count_users(session) == 0:
            return f"kvnotes: serving {where} needs at least one user: run `kvnotes users add NAME` first"
    return None


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def announce_when_answering(host: str, port: int, every_s: float = 0.2) -> threading.Thread:
    """Print "kvnotes: open http://HOST:PORT/" once the home page answers (issue 43: printed before,
    the address led to a page that did not answer for many seconds), from a daemon thread that asks
    every `every_s` seconds; any HTTP answer counts (a sign-in redirect or page too)."""
    address = f"http://{host}:{port}/"
    local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host, host)  # a wildcard: ask here
    probe = f"http://{local}:{port}/"

    def wait() -> None:
        while True:
            try:
                with urllib.request.urlopen(probe, timeout=5):
                    break
            except urllib.error.HTTPError:  # an answer all the same (401, 403, …)
                break
            except OSError:
                time.sleep(every_s)
        print(f"kvnotes: open {address}", flush=True)

    thread = threading.Thread(target=wait, name="announce-address", daemon=True)
    thread.start()
    return thread


def cmd_serve(args: argparse.Namespace) -> int:
    """Migrate, check, start the supervised worker, serve the web app until Ctrl-C / SIGTERM, stop both."""
    from commands.web import serve_web
    from data.db import release_connections
    from data.logs import configure_logging
    from data.migrate import upgrade_to_head
    from data.settings import get_settings

    configure_logging(logging.WARNING)  # key=value lines with their extra fields (data.logs); quiet
    models = _models(args.model)        # until the start-up check, whose refusal is one line
    os.environ["KVNOTES_BIND_HOST"] = args.host  # the app's sign-in rule and Host allowlist need it
    if args.model:  # the web app offers exactly what the worker serves
        os.environ["KVNOTES_DEFAULT_MODEL"] = models[0]
        os.environ["KVNOTES_MODELS"] = ",".join(models)
    get_settings.cache_clear()
    upgrade_to_head()
    problem = startup_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    release_connections()  # this process only supervises: it holds no SQLite file from here on
    configure_logging(logging.INFO)
    supervisor = None if args.no_worker else WorkerSupervisor(models, args.name, env=dict(os.environ))
    replays = None if args.no_worker else WorkerSupervisor(models, env=dict(os.environ), replays=True)
    for started in (supervisor, replays):
        if started is not None:
            started.start()
    reaper = Reaper()  # the one reaper, also when the workers run elsewhere (`--no-worker`)
    reaper.start()
    processes = args.web_workers or os.cpu_count() or 1
    print(f"kvnotes: starting the web app on port {args.port} ({processes} web processes, "
          f"{'no worker' if supervisor is None else f'worker {supervisor.name}'}, "
          f"models {', '.join(models)}); the address follows once the page answers", flush=True)
    announce_when_answering(args.host, args.port)
    settings = get_settings()
    if not settings.loopback_bind or settings.auth == "required":
        print(f"kvnotes: sign-in required; answering the host names {', '.join(settings.allowed_hosts)} "
              "(KVNOTES_ALLOWED_HOSTS)")
    # the web supervisor turns SIGINT/SIGTERM into a graceful stop of its processes; before it is
    # up, SIGTERM is an exception (like SIGINT's), so `finally` stops the worker either way.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        serve_web(args.host, args.port, processes)
    finally:
        reaper.stop()
        for started in (replays, supervisor):
            if started is not None:
                log.info("stopping the worker %s (code %s)", started.name, started.stop())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Become a Celery worker for the given models' queues, or with `--replays` the replays' worker
    (never returns)."""
    if args.replays:
        os.execv(sys.executable, replay_worker_command(args.name, args.loglevel))
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
    p = subparsers.add_parser(
        "serve", help="start the web app and one supervised worker (migrates the database first)"
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address; anything but loopback needs sign-in (README)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--model", default=None,
        help="model(s) the worker serves, comma-separated (default: every model offered, KVNOTES_MODELS)",
    )
    p.add_argument("--name", default=None,
                   help="worker node name (default kvnotes-<model>-<random>@<host>, new each start)")
    p.add_argument("--no-worker", action="store_true", help="serve the web app only (workers run elsewhere)")
    p.add_argument("--web-workers", type=_positive, default=None, metavar="N",
                   help="web processes on one socket, each replaced if it dies (default: the core count)")
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser("worker", help="start a Celery worker for one model's queue")
    p.add_argument("--model", default=None, help="model(s) to serve, comma-separated (default: settings)")
    p.add_argument("--concurrency", type=int, default=1, help="kept at 1: one model, one task at a time")
    p.add_argument("--name", default=None, help="worker node name (default kvnotes-<model>-<random>@<host>)")
    p.add_argument("--replays", action="store_true",
                   help="serve the replays' queue instead (HTTP calls, KVNOTES_REPLAY_THREADS at once, "
                        "no model)")
    p.add_argument("--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)
