"""The web process's Celery *client*: it enqueues work by task name and never imports the worker.

Tasks go to one queue per model (`model.<alias>`), so a worker that holds a model only receives
work for it. The broker carries ids only; everything else is in the database. A run's message is
sent only once its row is committed, under the run's own token (`runs.task_id`, the Celery task id):
a worker runs a message only for the run that holds its token (`worker.run_rows.claim`), so a
message whose run was deleted, or never saved, is dropped at once and never starts another run.
Enqueueing fails fast: if the broker cannot be reached within `broker_connect_timeout_s`, `QueueUnavailable`
is raised with the reason (routes answer 503 and save nothing), instead of Celery's default of
retrying the publish for as long as it takes.
"""

from __future__ import annotations

import logging
import re
import uuid
from functools import lru_cache
from typing import Any

from celery import Celery

from data.models import Run, Skill
from data.settings import Settings, get_settings, redact

log = logging.getLogger(__name__)

TASK_RUN = "kvnotes.run"
TASK_COMPILE_SKILL = "kvnotes.compile_skill"
TASK_REPLAY = "kvnotes.replay"
TASK_TRAJECTORY = "kvnotes.trajectory"
TASK_NAMES = (TASK_RUN, TASK_COMPILE_SKILL, TASK_REPLAY, TASK_TRAJECTORY)
# replays are I/O (HTTP calls to the user's server), not model work: their own queue, served by a
# small thread pool (`kvnotes serve` starts it: `commands.supervisor`), never by a model's worker
REPLAY_QUEUE = "replays"


BROKER_DOWN = (
    "the work queue (broker) cannot take work right now; try again shortly (details in the server log)"
)


class QueueUnavailable(RuntimeError):
    """The broker could not take the message; `reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def queue_for(model: str) -> str:
    """The queue of the workers holding `model`: `model.<alias>`; a path or hub id is made safe."""
    return "model." + re.sub(r"[^A-Za-z0-9_.-]+", "_", model.strip()).strip("_")


def celery_config(settings: Settings) -> dict[str, Any]:
    """The configuration the client and the worker share (the worker adds its own on top)."""
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "task_default_queue": queue_for(settings.default_model),
        # Fallback routes; enqueue_* name the model's queue explicitly.
        "task_routes": {**{name: {"queue": queue_for(settings.default_model)} for name in TASK_NAMES},
                        TASK_REPLAY: {"queue": REPLAY_QUEUE}},
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": settings.broker_connect_timeout_s,
        "broker_connection_max_retries": 1,
        "task_publish_retry": False,
        "redis_socket_connect_timeout": settings.broker_connect_timeout_s,
        "redis_socket_timeout": settings.broker_connect_timeout_s,
        "broker_transport_options": broker_transport_options(settings),
    }


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """Transport options for Redis only. kombu's SQLAlchemy transport forwards every transport
    option to `sqlalchemy.create_engine`, which rejects unknown keywords: pass it nothing."""
    if not settings.broker_url.startswith(("redis://", "rediss://", "redis+socket://")):
        return {}
    visibility = settings.redis_visibility_timeout_s
    return {
        "socket_connect_timeout": settings.broker_connect_timeout_s,
        "visibility_timeout": visibility,
        # sweep for abandoned (unacked) messages every `interval` s instead of the default ~100 s
        "unacked_restore_interval": max(1, min(10, visibility // 2)),
        "unacked_restore_throttle": 1,
    }


@lru_cache(maxsize=1)
def get_celery() -> Celery:
    """The web process's client (the worker builds its own app on the same `celery_config`)."""
    client = Celery("kvnotes-web")
    client.conf.update(celery_config(get_settings()))
    return client


def _send(name: str, kwargs: dict[str, Any], queue: str, task_id: str | None = None,
          priority: int | None = None) -> str:
    settings = get_settings()
    client = get_celery()
    task_id = task_id or str(uuid.uuid4())
    try:
        with client.connection_for_write() as connection:
            connection.ensure_connection(
                max_retries=1, interval_start=0.2, timeout=settings.broker_connect_timeout_s
            )
            options = {} if priority is None else {"priority": priority}
            client.send_task(
                name, kwargs=kwargs, queue=queue, task_id=task_id, retry=False, connection=connection,
                **options,
            )
    except Exception as exc:  # any failure to hand over the message means: not enqueued
        # the details (the broker's address, SQL, file paths) go to the log only; the answer is plain
        log.warning("enqueue failed", extra={
            "task": name, "queue": queue, "broker": redact(settings.broker_url),
            "reason": f"{type(exc).__name__}: {exc}",
        })
        raise QueueUnavailable(BROKER_DOWN) from exc
    log.info("enqueued", extra={"task": name, "queue": queue, "task_id": task_id, **kwargs})
    return task_id


SWEEP_PRIORITY = 9  # Redis takes priority 0 (every plain run) first: a sweep's edits never starve runs


def enqueue_run(run: Run, priority: int | None = None) -> str:
    """Send `kvnotes.run(run_id=...)` to the run's model queue under the run's token (`run.task_id`,
    which must already be committed with the row); returns the Celery task id (the token). A sweep's
    edits go at `SWEEP_PRIORITY`, behind other users' runs on Redis (brokers without priorities
    keep the order they were sent in)."""
    if not run.task_id:
        raise ValueError(f"run {run.id} has no token (task_id): commit it with one before sending")
    return _send(TASK_RUN, {"run_id": run.id}, queue_for(run.model), run.task_id, priority)


def enqueue_compile(skill: Skill) -> str:
    """Send `kvnotes.compile_skill(skill_id=...)` to the skill's model queue."""
    return _send(TASK_COMPILE_SKILL, {"skill_id": skill.id}, queue_for(skill.model))


def enqueue_replay(replay_id: int, task_id: str) -> str:
    """Send `kvnotes.replay(replay_id=...)` under the replay's token to the replays' own queue
    (`REPLAY_QUEUE`: a replay needs no model, only a thread to drive the user's server)."""
    return _send(TASK_REPLAY, {"replay_id": replay_id}, REPLAY_QUEUE, task_id)


def enqueue_trajectory(trajectory_id: int, task_id: str, model: str) -> str:
    """Send `kvnotes.trajectory(trajectory_id=...)` under the trajectory's token to its model's queue."""
    return _send(TASK_TRAJECTORY, {"trajectory_id": trajectory_id}, queue_for(model), task_id)


def revoke(task_id: str) -> bool:
    """Ask workers to drop `task_id`. Best effort: the SQLAlchemy broker has no broadcast, so the
    database's `cancelled` status (checked by the worker between stages) is what really stops a run."""
    try:
        get_celery().control.revoke(task_id)
        return True
    except Exception as exc:
        log.info("revoke not delivered", extra={"task_id": task_id, "reason": str(exc)})
        return False


def broker_status() -> str:
    """'ok', or why the broker cannot be reached."""
    settings = get_settings()
    try:
        with get_celery().connection_for_write() as connection:
            connection.ensure_connection(
                max_retries=1, interval_start=0.2, timeout=settings.broker_connect_timeout_s
            )
        return "ok"
    except Exception as exc:  # health is public: the address and the error go to the log only
        log.warning("broker unreachable", extra={"broker": redact(settings.broker_url),
                                                 "reason": f"{type(exc).__name__}: {exc}"})
        return "unreachable (details in the server log)"


def reset_celery() -> None:
    """Forget the cached client (tests that switch `BROKER_URL`)."""
    get_celery.cache_clear()
