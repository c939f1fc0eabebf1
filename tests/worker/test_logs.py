"""Logs that carry their facts: `kvnotes serve` and a real Celery worker print one key=value line per
record with the record's `extra` fields; a refused enqueue names its reason in the log (and only
there: the answer stays plain)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from data.logs import KeyValueFormatter
from tests.conftest import REPO, free_port, kvnotes_env

DOC = "Customer record. status: active. Only active customers may log in."


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for(path: Path, text: str, seconds: float) -> str:
    deadline = time.time() + seconds
    while time.time() < deadline:
        content = path.read_text(errors="replace") if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}:\n{content[-3000:]}")


def test_a_record_is_one_line_with_its_extra_fields() -> None:
    record = logging.LogRecord("data.queue", logging.WARNING, __file__, 1, "enqueue failed", None, None)
    record.__dict__.update(task="kvnotes.run", reason='ConnectionError: "refused" at x=1', run_id=7)
    line = KeyValueFormatter().format(record)
    assert "\n" not in line and line.startswith("ts=")
    assert ' level=WARNING logger=data.queue msg="enqueue failed" task=kvnotes.run ' in line
    assert line.endswith('reason="ConnectionError: \\"refused\\" at x=1" run_id=7')


def test_serve_logs_a_refused_enqueue_with_its_reason(tmp_path: Path) -> None:
    port = free_port()
    env = {**kvnotes_env(tmp_path, "redis://127.0.0.1:1/0", KVNOTES_BROKER_TIMEOUT="1"),
           "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        command = [sys.executable, "-m", "commands.cli", "serve", "--port", str(port), "--no-worker"]
        server = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, "Uvicorn running", 60)
        base = f"http://127.0.0.1:{port}"
        status, notebook = _post(base + "/api/notebooks", {"title": "t", "text": DOC})
        assert status == 201, notebook
        status, answer = _post(f"{base}/api/notebooks/{notebook['id']}/runs", {"question": "Log in?"})
        assert status == 503 and "127.0.0.1:1" not in answer["detail"]
        content = _wait_for(log, 'msg="enqueue failed"', 20)
    finally:
        server.terminate()
        server.wait(timeout=30)
    line = next(line for line in content.splitlines() if 'msg="enqueue failed"' in line)
    assert " level=WARNING logger=data.queue " in line
    assert " task=kvnotes.run queue=model.smollm2-135m " in line
    assert "broker=redis://127.0.0.1:1/0" in line and 'reason="OperationalError' in line
    started = next(line for line in content.splitlines() if "Uvicorn running" in line)
    assert started.startswith("ts=") and " logger=uvicorn.error " in started  # uvicorn's records too


def test_a_worker_logs_key_value_lines(tmp_path: Path) -> None:
    from commands.serve import worker_command

    env = {**kvnotes_env(tmp_path, KVNOTES_DEFAULT_MODEL="tiny-llama", KVNOTES_MODELS="tiny-llama"),
           "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", "from data.migrate import upgrade_to_head; upgrade_to_head()"],
                   env=env, cwd=REPO, check=True)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(worker_command(["tiny-llama"], "test-logs@%h"), env=env, cwd=REPO,
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        content = _wait_for(log, "logger=celery.apps.worker", 120)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    ready = next(line for line in content.splitlines() if "logger=celery.apps.worker" in line)
    assert ready.startswith("ts=") and ' level=INFO logger=celery.apps.worker msg="test-logs@' in ready
    records = [line for line in content.splitlines() if " level=" in line]
    assert records and all(line.startswith("ts=") for line in records), content[-2000:]  # Celery's own too
