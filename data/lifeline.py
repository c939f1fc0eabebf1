"""A child of `kvnotes serve` (its worker, each web process) dies with it: `die_with_parent` asks
Linux to SIGKILL this process when the `serve` that started it dies (`PR_SET_PDEATHSIG`), and
exits at once if that parent is already gone, so a `kill -9` of `serve` leaves no orphan serving
the port or the queue. `serve` names itself to its children in `KVNOTES_SUPERVISOR_PID`
(`data.settings.Settings.supervisor_pid`); 0 (not started by `serve`) does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when `parent_pid` (the `serve` that started it) dies."""
    if not parent_pid:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's own shutdown must do
        log.warning("parent-death signal not available on this system")
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os._exit(1)
