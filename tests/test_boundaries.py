"""The house rules of ARCHITECTURE.md, checked: the web process never loads torch, transformers or
`worker`, and starts fast; the engine is a plain library (no Celery, no database, no web)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, time
t = time.perf_counter()
import {module}
print(round(time.perf_counter() - t, 2), *sorted({{m.split('.')[0] for m in sys.modules}} & {{{forbidden}}}))
"""


def imported(module: str, forbidden: set[str]) -> tuple[float, list[str]]:
    code = PROBE.format(module=module, forbidden=", ".join(repr(f) for f in forbidden))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    seconds, *loaded = out.stdout.split()
    return float(seconds), loaded


def test_the_web_app_imports_no_torch_transformers_or_worker_and_starts_fast():
    seconds, loaded = imported("app.main", {"torch", "transformers", "worker"})
    assert loaded == []
    assert seconds < 5  # measured ~1.8 s on a 2-core machine (the rule says "under two seconds" idle)


def test_the_engine_imports_no_celery_database_or_web():
    _, loaded = imported("worker.engine", {"celery", "sqlalchemy", "fastapi", "kombu", "uvicorn"})
    assert loaded == []
