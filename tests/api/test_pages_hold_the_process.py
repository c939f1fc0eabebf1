"""No page kills its web process (issue 51 item 1).

uvicorn's supervisor kills a web process that leaves its health ping unanswered for 5 s, and the
ping is answered by a thread of that process: a request that holds the GIL that long kills the
process and every request it carries. Reading gemma3-270m's 33 MB `tokenizer.json` held it for
0.6 s on an idle core and 4.9 s on a loaded machine, on the first Trajectory panel of a fresh
process; the counts now run in a helper process (`app.services.prompt_length`).

Here a fresh `kvnotes serve` with ONE web process (so /api/health shares the process with the
pages), with the machine loaded by one CPU-burning process per core, answers the Trajectory panel,
`tokens.json` and the notebook page of a gemma3-270m notebook, and a Start refused for a prompt past
smollm2-135m's context (counted by the helper), while /api/health, asked every 0.1 s, never takes
1 s to answer; the web process is never replaced.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import httpx

from tests.conftest import REPO, api_notebook, free_port, kvnotes_env, migrate, stop_process, until

DOC = ("Shipment log. Parcel 4417 left the depot at 09:07; the account status is active. "
       "Only active accounts may book a pickup. ") * 6
LONG = ("The customer wrote again about the invoice for March, asked whether the discount still "
        "applies after the plan change, and attached the logs of the last three sign-in attempts. ")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/api/health", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False


def _health_meanwhile(url: str, stop: threading.Event, seconds: list[float], errors: list[str]) -> None:
    """/api/health every 0.1 s until `stop`: how long each answer took (or why none came)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = client.get("/api/health")
                if r.json().get("database") != "ok":
                    errors.append(r.text)
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
            seconds.append(time.perf_counter() - t0)
            time.sleep(0.1)


def test_a_fresh_process_answers_a_gemma3_notebook_s_pages_with_health_answering_meanwhile(tmp_path):
    from worker.engine.models import ensure_converted

    for alias in ("gemma3-270m", "smollm2-135m"):  # the bundled models' files, where the web reads them
        ensure_converted(alias, REPO / "var" / "test-data")
    (tmp_path / "models").symlink_to(REPO / "var" / "test-data" / "models")
    env = {**os.environ, **kvnotes_env(tmp_path, KVNOTES_DEFAULT_MODEL="gemma3-270m",
                                       KVNOTES_MODELS="gemma3-270m,smollm2-135m"), "PYTHONPATH": str(REPO)}
    migrate(env["DATABASE_URL"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    burners: list[subprocess.Popen] = []
    with log.open("w") as out:
        command = ["serve", "--no-worker", "--web-workers", "1", "--port", str(port)]
        serve = subprocess.Popen([sys.executable, "-m", "commands.cli", *command], env=env, cwd=REPO,
                                 stdout=out, stderr=subprocess.STDOUT)
        try:
            until("serve answers", lambda: _answers(url), 60)
            nb = api_notebook(url + "/api", DOC, "shipment log", ("active", "suspended", "status"),
                              model="gemma3-270m")
            small = api_notebook(url + "/api", DOC, "shipment log", ("active", "suspended", "status"))
            # the machine loaded: one process burning a core, for each core
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                       for _ in range(os.cpu_count() or 2)]
            stop, seconds, errors = threading.Event(), [], []
            poller = threading.Thread(target=_health_meanwhile, args=(url, stop, seconds, errors))
            poller.start()
            answers = {}
            try:
                with httpx.Client(base_url=url, timeout=120) as client:
                    for path in (f"/notebooks/{nb}/trajectory", f"/notebooks/{nb}/tokens.json",
                                 f"/notebooks/{nb}"):
                        answers[path] = client.get(path).status_code
                    turns = [{"append": f"\n[tool] ticket {i}: " + (LONG * 60)[:7900]} for i in range(8)]
                    body = {"turns": turns, "strategies": ["erratum"], "question": "Can this customer book?",
                            "choices": ["yes", "no"]}
                    start = client.post(f"/api/notebooks/{small}/trajectories", json=body)
            finally:
                stop.set()
                poller.join()
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
            stop_process(serve, 30)
    text = log.read_text()
    print("health answers", len(seconds), "slowest", f"{max(seconds):.2f} s", "pages", answers,
          "load", os.getloadavg())
    assert set(answers.values()) == {200}, (answers, text[-3000:])
    # counted by the helper process: a 422 naming the first turn past smollm2-135m's 8192 tokens
    assert start.status_code == 422 and "past smollm2-135m's context of 8192 tokens" in start.text, start.text
    assert not re.search(r"Child process \[\d+\] died", text), text[-3000:]  # uvicorn's words for a kill
    assert len(re.findall(r'msg="Started server process', text)) == 1, text[-3000:]  # never replaced
    assert not errors, errors[:3]
    assert len(seconds) >= 5 and max(seconds) < 1.0, sorted(seconds)[-5:]
