"""`kvnotes serve`'s web processes: uvicorn's process supervisor runs the web app in `processes`
children on one listening socket, and starts a new child at once when one dies; `serve` itself only
supervises (it holds no database connection: `data.db.release_connections`).

Why a supervised child even for one process: SQLite keeps its rollback journal by default, which
maps nothing (`data.db`), but in WAL mode (`KVNOTES_SQLITE_JOURNAL=wal`) every connection memory-maps the
WAL index (`-shm`); when storage takes that file away under the mapping (a file system that turns
read-only after an error, `chattr +i`), the next touch is a SIGBUS, which no Python code can catch
(`data.db` says more). A web process killed so is replaced within a second, and the replacement
opens the database afresh once it can be written: nobody restarts the app by hand.

Each child dies with `serve` (`KVNOTES_SUPERVISOR_PID`, `data.lifeline`) and logs as the rest of
kvnotes does (key=value lines, `data.logs`). Ctrl-C or SIGTERM stops the children gracefully, then
`serve` stops its worker.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("kvnotes.serve")

APP = "app.main:app"  # the web app by its import string: commands never import it
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"kv": {"()": "data.logs.KeyValueFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "kv", "stream": "ext://sys.stderr"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
}


def serve_web(host: str, port: int, processes: int) -> None:
    """Serve the web app on `host:port` from `processes` supervised children until Ctrl-C / SIGTERM."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from data.settings import get_settings

    os.environ["KVNOTES_SUPERVISOR_PID"] = str(os.getpid())  # the children die with this process
    config = uvicorn.Config(APP, host=host, port=port, workers=max(1, processes), log_level="info",
                            log_config=LOG_CONFIG, **get_settings().proxy_options)  # X-Forwarded-For
    sock = config.bind_socket()
    sock.listen(config.backlog)  # connections wait in the backlog while children start or restart,
    # never refused: "Uvicorn running" then means a request will be answered
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
