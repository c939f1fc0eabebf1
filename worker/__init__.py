"""kvnotes worker: the Celery process that owns the model (`tasks`, `celery_app`, the run loop in
`run_rows`) and the engine library it drives (`engine`). The command line, `serve` included, lives in
the `commands` package above it.

Importing this package has no side effects. The thread settings that must precede torch
(`OMP_WAIT_POLICY`) are set by the entry points: `commands.cli.main` and the Celery app's start-up.
"""
