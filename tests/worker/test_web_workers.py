"""`kvnotes serve --web-workers 2`: two web processes answer on one port, a web process killed
with SIGKILL is replaced (the app answering and writing throughout), and stopping `serve` leaves
no web process behind. Also what `--web-workers` refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, kvnotes_cli, kvnotes_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _web_processes(parent: int) -> list[int]:
    """The pids of `parent`'s web processes (spawned children running uvicorn; not the resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def test_two_web_processes_one_killed_is_replaced_and_none_outlives_serve(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path, KVNOTES_DEFAULT_MODEL="tiny-llama",
                                       KVNOTES_MODELS="tiny-llama"), "PYTHONPATH": str(REPO)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("wb")
    command = [sys.executable, "-m", "commands.cli", "serve", "--no-worker", "--port", str(port),
               "--web-workers", "2"]
    serve = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(_web_processes(serve.pid)) < 2 or not _answers(url):
            assert serve.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        first = _web_processes(serve.pid)
        assert len(first) == 2, first
        os.kill(first[0], signal.SIGKILL)
        codes = []
        deadline = time.monotonic() + 120
        while True:  # the other process answers meanwhile; the killed one is replaced
            note = {"title": f"n{len(codes)}", "text": "a b c"}
            r = httpx.post(url + "/api/notebooks", json=note, timeout=30)
            codes.append(r.status_code)
            now = _web_processes(serve.pid)
            if len(now) == 2 and first[0] not in now:
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.5)
        print(f"\nweb processes {first} → {now} after SIGKILL of {first[0]}; writes meanwhile {codes}")
        assert set(codes) == {201} and first[1] in now
        assert len(httpx.get(url + "/api/notebooks", timeout=30).json()) == len(codes)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        log.close()
    assert _web_processes(serve.pid) == []


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/api/notebooks", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_web_workers_must_be_a_positive_number(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)}
    done = kvnotes_cli("serve", "--web-workers", "0", env=env)
    assert done.returncode == 2 and "--web-workers: must be 1 or more, not 0" in done.stderr
