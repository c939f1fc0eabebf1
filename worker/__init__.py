"""kvnotes worker: the Celery process that owns the model (`tasks`, `celery_app`), the command line
(`cli`, `serve`), and the engine library it drives (`engine`).

Importing this package has no side effects. The thread settings that must precede torch
(`OMP_WAIT_POLICY`) are set by the entry points: `worker.cli.main`, which the Celery worker, `serve`
and its supervised worker all start from.
"""
