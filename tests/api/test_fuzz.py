"""schemathesis against the real server's /openapi.json: thousands of generated requests (bad ids,
huge numbers, odd Unicode, missing and extra fields, stateful sequences) and not one 5xx.

The server is uvicorn on a free port with the embedded database and broker and no worker: runs
queue until the run caps answer 429, which is what keeps the fuzzing bounded. `/api/health` is
left out: with no worker its documented answer is 503. Bounded by `FUZZ_SECONDS`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ServedApp, missing

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FUZZ_SECONDS = 150


def test_no_generated_request_gets_a_server_error(tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    if st is None:
        missing("schemathesis is not installed (pip install -e '.[test]')")
    with ServedApp(tmp_path, KVNOTES_BROKER_TIMEOUT="1") as app:
        done = subprocess.run(
            [st, "run", f"{app.url}/openapi.json", "--checks", "not_a_server_error",
             "--exclude-path", "/api/health", "--max-examples", "15", "--generation-database", "none",
             "--workers", "1", "--max-time", str(FUZZ_SECONDS), "--seed", "20261130"],
            capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
        report = done.stdout[-6000:]
        assert "Server error" not in done.stdout, report
        assert done.returncode == 0, report
        generated = [line for line in done.stdout.splitlines() if "generated" in line]
        print("\n" + (generated[-1].strip() if generated else report[-500:]))
    assert "Traceback" not in (tmp_path / "server.log").read_text()
