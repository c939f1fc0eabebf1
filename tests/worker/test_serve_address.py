"""`kvnotes serve` prints the address once the page answers (issue 43): before it said "open
http://…" many seconds before the page did. Each line is read as it comes; the page is asked the
moment the address appears, and answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, kvnotes_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_address_is_printed_once_the_page_answers(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path, KVNOTES_DEFAULT_MODEL="tiny-llama",
                                       KVNOTES_MODELS="tiny-llama"), "PYTHONPATH": str(REPO)}
    port = free_port()
    command = [sys.executable, "-m", "commands.cli", "serve", "--no-worker", "--port", str(port),
               "--web-workers", "1"]
    serve = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = serve.stdout.readline()
            assert line or serve.poll() is None, "".join(lines)
            lines.append(line)
            if "kvnotes: open http://" in line:
                break
        assert lines[-1].strip() == f"kvnotes: open http://127.0.0.1:{port}/", lines
        # asked the moment the address appears: the page answers (no retry)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200
        started = [i for i, line in enumerate(lines) if "starting the web app" in line]
        assert started and started[0] < len(lines) - 1, lines  # said first what it waits for
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        serve.stdout.close()
