"""kvnotes worker: the Celery process that owns the model (`tasks`, `celery_app`), the command line
(`cli`, `serve`), and the engine library it drives (`engine`).

Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine, spinning threads of two
processes made a 28-token forward take 5.5 s instead of 0.27 s (docs/benchmarks.md). This must be
set before torch loads, and every worker-side entry point (the command line, the Celery worker)
imports this package first.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
