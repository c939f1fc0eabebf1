"""Shared fixtures: where converted real models live, THE environment of an isolated kvnotes, the
one served app, the `kvnotes` command, PostgreSQL and Chromium.

Every test that needs a database, a broker or a data folder gets them from `kvnotes_env` (the
variables) applied by the `isolated` fixture (this process) or handed to a subprocess (a worker,
the served app: `ServedApp`). Converted real models live in `<repo>/var/test-data` so later runs
reuse them. Under `CI=true` a missing PostgreSQL or Chromium fails the suite; elsewhere it skips.
No test module imports another test module: shared helpers live here or in a package's conftest.

A run (scripts/test.sh) is two pytest-xdist workers: each test file runs on one of them, and every
test that needs the vLLM server or Chromium in one group on one worker, which starts each once
(`shared`, `pytest_collection_modifyitems`). A new SQLite database is a copy of one migrated once
per process (`migrate`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
UNDER_CI = os.environ.get("CI") == "true"
PG_ADMIN_URL = os.environ.get("KVNOTES_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
CHROMIUM = os.environ.get("KVNOTES_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Where the bundled real models are converted once: `<repo>/var/test-data`, kept between runs."""
    path = REPO / "var" / "test-data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def kvnotes_env(data: Path, broker_url: str | None = None, **overrides: str) -> dict[str, str]:
    """The variables of a kvnotes that keeps everything under `data`: its data folder, SQLite
    database, the embedded SQLite broker (or `broker_url`) and the result backend."""
    return {
        "KVNOTES_DATA": str(data),
        "DATABASE_URL": f"sqlite:///{data}/kvnotes.db",
        "BROKER_URL": broker_url or f"sqla+sqlite:///{data}/broker.db",
        "RESULT_BACKEND": f"db+sqlite:///{data}/results.db",
        **overrides,
    }


def reset_caches() -> None:
    """Forget settings, database engines and the Celery client so the next use reads the environment."""
    from data.db import reset_engines
    from data.queue import reset_celery
    from data.settings import get_settings

    get_settings.cache_clear()
    reset_engines()
    reset_celery()


@contextmanager
def applied(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`env` set in this process (caches reset) for the block; the previous environment after."""
    saved = dict(os.environ)
    os.environ.update(env)
    reset_caches()
    try:
        yield env
    finally:
        os.environ.clear()
        os.environ.update(saved)
        reset_caches()


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, small tmpfs mounted at `path` (root only; the test is skipped elsewhere): a disk that
    fills up."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


_MIGRATED: list[Path] = []  # a SQLite database this test process migrated to head once


def migrate(url: str | None = None) -> None:
    """`data.migrate.upgrade_to_head(url)` (default: the settings' database), as `kvnotes serve`
    runs it, made quick for a SQLite file that does not exist yet: it starts as a copy of one this
    process migrated once, which `upgrade_to_head` then finds at head (its files still made 0600).
    The migrations themselves, one by one, up and down: tests/data/test_migrations.py."""
    import sqlite3
    import tempfile

    from sqlalchemy.engine import make_url

    from data.migrate import upgrade_to_head
    from data.settings import get_settings

    target = make_url(url or get_settings().database_url)
    path = Path(target.database or ":memory:")
    if target.get_backend_name() == "sqlite" and str(path) != ":memory:" and not path.exists():
        if not _MIGRATED:
            template = Path(tempfile.mkdtemp(prefix="kvnotes-migrated-")) / "kvnotes.db"
            upgrade_to_head(f"sqlite:///{template}")
            _MIGRATED.append(template)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        with sqlite3.connect(_MIGRATED[0]) as source, sqlite3.connect(path) as copy:
            source.backup(copy)
        source.close()
        copy.close()
    upgrade_to_head(url)


@pytest.fixture
def isolated(tmp_path: Path) -> Iterator[Callable[..., dict[str, str]]]:
    """`isolated(broker_url=None, **overrides)` points this process at a fresh kvnotes under
    `tmp_path` (see `kvnotes_env`) and returns its variables; undone after the test."""
    stack: list = []

    def apply(broker_url: str | None = None, **overrides: str) -> dict[str, str]:
        context = applied(kvnotes_env(tmp_path, broker_url, **overrides))
        stack.append(context)
        return context.__enter__()

    yield apply
    for context in reversed(stack):
        context.__exit__(None, None, None)


@pytest.fixture
def make_client(isolated):
    """`make_client(broker_url=None, **overrides)`: a FastAPI TestClient on a fresh, migrated SQLite
    database, with the embedded SQLAlchemy broker beside it (or `broker_url`, e.g. an unreachable
    one) and any other variables (`KVNOTES_AUTH="required"`, limits). It talks to the app as a
    loopback client of the loopback default (no sign-in), unless `KVNOTES_AUTH=required`."""
    from fastapi.testclient import TestClient

    clients: list[TestClient] = []

    def build(broker_url: str | None = None, **overrides: str) -> TestClient:
        isolated(broker_url, KVNOTES_BROKER_TIMEOUT="1", **overrides)
        from app.main import create_app

        migrate()
        # a loopback client of the loopback default: no sign-in, like `scripts/run.sh`
        client = TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


# ---- a service the suite needs: fail under CI, skip elsewhere -------------------------------------


def missing(what: str) -> None:
    """A required service or tool is absent: a failure under `CI=true` (CI must not go green without
    it), a skip on a developer's machine. Works at module level too."""
    if UNDER_CI:
        pytest.fail(f"{what} (required under CI=true)", pytrace=False)
    pytest.skip(f"{what} (set CI=true to make this a failure)", allow_module_level=True)


def chromium() -> ModuleType:
    """playwright's sync API, once Chromium (`KVNOTES_CHROMIUM`, default /usr/bin/chromium) is known
    to be there; call it at the top of a browser test module."""
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} is not installed (apt-get install chromium, or set KVNOTES_CHROMIUM)")
    try:
        from playwright import sync_api
    except ImportError:
        missing("the playwright package is not installed (pip install -e '.[test]')")
    return sync_api


# ---- what a run starts once: a server, Chromium ---------------------------------------------------

_SHARED: dict[str, tuple[Any, ExitStack]] = {}  # fixture name: (its value, what stops it)
_LAST_USE: dict[str, str] = {}  # fixture name: the last test of the run that uses it
_FAILED: dict[str, BaseException] = {}  # fixture name: why it could not start


def shared(fixture: str, start: Callable[[], AbstractContextManager]) -> Any:
    """What `start()` enters, once per test process: started by the first test that uses `fixture`
    and stopped after the last one of the run that does (`pytest_runtest_teardown`), not at the
    session's end, so a server does not idle beside the tests that follow it. The tests that need
    a server run together, on one xdist worker (`pytest_collection_modifyitems`): once per run."""
    if fixture in _FAILED:  # as pytest does for a session fixture: tried once, the same error after
        raise _FAILED[fixture]
    if fixture not in _SHARED:
        stack = ExitStack()
        try:
            value = stack.enter_context(start())
        except BaseException as exc:
            stack.close()
            _FAILED[fixture] = exc
            raise
        _SHARED[fixture] = (value, stack)
    return _SHARED[fixture][0]


def _stop_shared(done: Callable[[str], bool]) -> None:
    """Stop what `shared` started whose use is `done` (the last started first: a served app before
    the vLLM server under it)."""
    for name in reversed(list(_SHARED)):
        if done(name):
            _SHARED.pop(name)[1].close()


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        for name in getattr(item, "fixturenames", ()):
            _LAST_USE[name] = item.nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test's own teardown: stop what `shared` started that no later test uses."""
    try:
        return (yield)
    finally:
        _stop_shared(lambda name: nextitem is None or _LAST_USE.get(name) == item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_shared(lambda name: True)  # a run stopped early (-x, Ctrl-C)


@pytest.fixture
def s3_server(tmp_path_factory):
    """The run's SeaweedFS S3 server from scripts/s3.sh (tests/s3.py), started once and shared."""
    from tests.s3 import seaweedfs

    return shared("s3_server", lambda: seaweedfs(tmp_path_factory.mktemp("s3")))


@contextmanager
def _chromium() -> Iterator[Any]:
    sync_api = chromium()
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    """The run's one headless Chromium (`shared`; missing: a failure under CI=true, else a skip). A
    test opens its own contexts (`browser.new_context(...)`): they are closed after it."""
    launched = shared("browser", _chromium)
    yield launched
    for context in launched.contexts:
        context.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A scratch PostgreSQL database `kvnotes_test_<random>`, dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    name = f"kvnotes_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        missing(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ---- the served app and the command line -----------------------------------------------------------


class _Listener(ThreadingHTTPServer):
    request_queue_size = 128  # socketserver's 5 resets connections that a burst of clients opens at once


class LocalServer:
    """A real HTTP server on a free loopback port, served from a thread: a test's upstream peer.
    `start(Handler)` listens and sets `url`; `close()` stops it."""

    def start(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = _Listener(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def listening(port: int, seconds: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Whether something listens on 127.0.0.1:`port` within `seconds` (False at once when `alive`
    says the process that should listen has exited)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and alive():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def until(what: str, check: Callable[[], Any], timeout: float, every: float = 0.25) -> Any:
    """Poll `check` every `every` s until it returns something true, and return that; an
    AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvnotes_cli(*args: str, env: dict[str, str], stdin: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """`kvnotes ARGS` in a subprocess with `env` (from the repository root)."""
    return subprocess.run([sys.executable, "-m", "commands.cli", *args], env=env, cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


class ServedApp:
    """THE served app of the tests: uvicorn serving `app.main:app` on a free port over a migrated
    kvnotes under `data`, and, with `worker=True`, a real Celery worker for `model` (with
    `replays=True`, the replays' own worker too).

    `overrides` are more variables (`KVNOTES_AUTH="required"`, limits). Use it as a context manager,
    or call `stop()`. `url`, `port`, `env` (for subprocesses such as `kvnotes_cli`), `db()` (a
    SQLAlchemy session on its database) and `log` (the server's output file)."""

    def __init__(self, data: Path, model: str = "smollm2-135m", worker: bool = False,
                 replays: bool = False, **overrides: str) -> None:
        self.env = {**os.environ, **kvnotes_env(data, KVNOTES_DEFAULT_MODEL=model,
                                                KVNOTES_MODELS=f"{model},smollm2-135m", **overrides),
                    "PYTHONPATH": str(REPO)}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data / "server.log"
        migrate(self.env["DATABASE_URL"])  # and the embedded broker's files 0600, as `serve` makes them
        from data.migrate import private_sqlite_file

        private_sqlite_file(self.env["BROKER_URL"].removeprefix("sqla+"))
        private_sqlite_file(self.env["RESULT_BACKEND"].removeprefix("db+"))
        self._out = self.log.open("w")
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(self.port),
             "--log-level", "warning"],
            env=self.env, cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT)]
        if worker:
            from commands.serve import worker_command

            self.procs.append(subprocess.Popen(worker_command([model], f"test-{self.port}@%h"),
                                               env=self.env, cwd=REPO, stdout=self._out,
                                               stderr=subprocess.STDOUT))
        if replays:  # the replays' own worker: a few threads on the replays' queue, no model
            from commands.serve import replay_worker_command

            self.procs.append(subprocess.Popen(replay_worker_command(f"test-replays-{self.port}@%h"),
                                               env=self.env, cwd=REPO, stdout=self._out,
                                               stderr=subprocess.STDOUT))
        if listening(self.port, 30):
            return
        self.stop()
        raise RuntimeError(f"the app did not start: {self.log.read_text()}")

    def db(self):
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        return Session(create_engine(self.env["DATABASE_URL"]))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, 20)
        self._out.close()

    def __enter__(self) -> ServedApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """Stop `proc` if it still runs: SIGTERM, `timeout` seconds to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def api_call(url: str, method: str = "GET", body: dict | None = None) -> dict:
    """One JSON request to a served kvnotes (urllib: no client session), its JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def api_notebook(api: str, text: str, title: str, field: tuple[str, str, str],
                 model: str = "smollm2-135m") -> int:
    """A notebook made through the served API at `api` (".../api") with one field: `field` is (the
    text it covers, its first occurrence; the new value; the label). Its id."""
    nb = api_call(f"{api}/notebooks", "POST", {"title": title, "model": model, "text": text})["id"]
    find, new_value, label = field
    start = text.index(find)
    api_call(f"{api}/notebooks/{nb}/fields", "POST",
             {"start": start, "end": start + len(find), "new_value": new_value, "label": label})
    return nb


# ---- the run in parallel: pytest-xdist's `--dist loadgroup` (scripts/test.sh) ---------------------

# what starts a server the run should start once: the session's vLLM server, Chromium
VLLM_FIXTURES = frozenset({"vllm_url", "base_model_url"})
S3_FIXTURES = frozenset({"s3_server"})  # the run's SeaweedFS (tests/s3.py), started once like vLLM
CHROMIUM_FIXTURES = frozenset({"browser", "browser_page"})
SERVERS = "servers"  # the group of every test that needs vLLM or Chromium


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _uses(item: pytest.Item, fixtures: frozenset[str]) -> bool:
    return bool(set(getattr(item, "fixturenames", ())) & fixtures)


def _grouped(config: pytest.Config, item: pytest.Item, group: str) -> None:
    """Put `item` in xdist group `group`. xdist's scheduler reads a group off the node id's `@group`
    suffix, which its worker adds by setting `item._nodeid`; pytest 9 keeps a node's id in `_id` (a
    `NodeId`) and ignores that, so every test would be a group of its own (tests of one file, which
    share Redis databases and module fixtures, on both workers at once). Here the suffix is set where
    this pytest keeps the id, on an xdist worker under --dist loadgroup only (a plain run keeps its ids)."""
    item.add_marker(pytest.mark.xdist_group(group))
    if not getattr(config.option, "loadgroup", False) or not hasattr(item, "_id"):
        return  # not a loadgroup worker, or a pytest whose `_nodeid` xdist sets itself
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test file is one xdist group (its tests share module fixtures and Redis databases, and run
    in order on one worker); every file with a test that needs vLLM or Chromium joins one group,
    `servers`, so a run starts each once (`shared`). The order: that group first (the files that need
    only vLLM, then both, then only Chromium, so each is up once and stopped before the next starts),
    then the files holding a slow test, then the others, each file's tests in their order (no worker
    is left with a long file at the end while the other idles; scripts/test.sh passes
    --no-loadscope-reorder to keep this order)."""
    if not hasattr(config, "workerinput"):
        return  # one process (no xdist worker): pytest's own order
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(_file_of(item), []).append(item)
    ranked = []
    for position, (path, its) in enumerate(files.items()):
        vllm = any(_uses(item, VLLM_FIXTURES | S3_FIXTURES) for item in its)
        browser = any(_uses(item, CHROMIUM_FIXTURES) or item.get_closest_marker("browser") for item in its)
        if vllm or browser:
            group, rank = SERVERS, (0, 1 if vllm and browser else 2 if browser else 0)
        else:
            group, rank = path, (1 if any(item.get_closest_marker("slow") for item in its) else 2, 0)
        for item in its:
            _grouped(config, item, group)
        ranked.append((rank, position, its))
    items[:] = [item for _, _, its in sorted(ranked, key=lambda r: r[:2]) for item in its]
