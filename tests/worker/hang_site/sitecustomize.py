"""A step that hangs, for tests/worker/test_job_deadline.py only (this folder is on PYTHONPATH in
that test's worker alone): once `worker.engine.trajectory` is imported, its `trajectory` hangs
inside its step for a request whose turn appends `HANG_MARKER`, the way a stuck kernel or a
driver that never returns holds a worker (the heartbeat thread goes on beating)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import time

HANG_MARKER = "HANG-IN-THIS-STEP"
TARGET = "worker.engine.trajectory"


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            real = module.trajectory

            def trajectory(engine, request, *args, **kwargs):
                if any(HANG_MARKER in (turn.append or "") for turn in request.turns):
                    while True:  # never comes back, never asks whether it was cancelled
                        time.sleep(3600)
                return real(engine, request, *args, **kwargs)

            module.trajectory = trajectory

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
