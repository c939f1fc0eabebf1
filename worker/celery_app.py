"""The one Celery app of the worker side, configured from `app.settings`.

A worker process owns its model(s): it runs the solo pool (one task at a time in the main process —
CUDA cannot be forked, and a model per process is the unit of scale), takes one message at a time
(`worker_prefetch_multiplier=1`) and acknowledges a message only when its task has finished
(`task_acks_late` + `task_reject_on_worker_lost`), so a worker that dies mid-run leaves the message
to be delivered again where the broker can do that (Redis: after `visibility_timeout`; the embedded
SQLAlchemy broker cannot — it marks a message invisible when it hands it out — so there the
watchdog in `worker.tasks` marks the run failed instead).

The solo pool does not enforce Celery's time limits (they are set for other pools and for
introspection); `worker.tasks` stops a run that passes `task_time_limit` at its next progress point.

Queues are per model, `model.<alias>`; the web side (`app.queue`) sends each task to the queue of
the run's model, and `kvnotes worker --model M` consumes `model.M`.

Environment knobs not in `Settings` (worker-only): `KVNOTES_TASK_TIME_LIMIT` (seconds, default
3600), `KVNOTES_VISIBILITY_TIMEOUT` (Redis only, default time limit + 60 s),
`KVNOTES_HEARTBEAT_MAX_AGE` (seconds after which a silent run counts as lost, default 120).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine, spinning threads of
# two processes made a 28-token forward take 5.5 s instead of 0.27 s (docs/benchmarks.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import logging
import os

from celery import Celery
from celery.signals import worker_ready

from app.queue import celery_config, queue_for
from app.settings import get_settings

__all__ = ["app", "make_celery", "queue_for"]

log = logging.getLogger(__name__)


def task_time_limit() -> int:
    return int(os.environ.get("KVNOTES_TASK_TIME_LIMIT", "3600"))


def heartbeat_max_age() -> float:
    return get_settings().heartbeat_max_age_s


def broker_transport_options(broker_url: str) -> dict[str, object]:
    """Transport options for Redis only. kombu's SQLAlchemy transport forwards every transport
    option to `sqlalchemy.create_engine`, which rejects unknown keywords: pass it nothing."""
    if not broker_url.startswith(("redis://", "rediss://", "redis+socket://")):
        return {}
    visibility = int(os.environ.get("KVNOTES_VISIBILITY_TIMEOUT", str(task_time_limit() + 60)))
    return {
        "visibility_timeout": visibility,
        # sweep for abandoned (unacked) messages every `interval` s instead of the default ~100 s
        "unacked_restore_interval": max(1, min(10, visibility // 2)),
        "unacked_restore_throttle": 1,
    }


def make_celery() -> Celery:
    """Build the app from the current settings (tests call it again after changing the env)."""
    settings = get_settings()
    limit = task_time_limit()
    celery = Celery("kvnotes", include=["worker.tasks"])
    celery.conf.update(celery_config(settings))  # what the web's client uses: URLs, routes, JSON
    celery.conf.update(
        # a worker keeps trying to reach its broker; the web's client fails fast instead
        broker_connection_max_retries=None,
        redis_socket_timeout=None,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_time_limit=limit,
        task_soft_time_limit=max(1, limit - 30),
        worker_pool="solo",
        worker_concurrency=1,
        worker_hijack_root_logger=False,
        broker_transport_options=broker_transport_options(settings.broker_url),
        broker_connection_retry_on_startup=True,
        result_expires=24 * 3600,
        task_track_started=False,  # the runs table is the source of truth for progress
    )
    return celery


app = make_celery()


@worker_ready.connect
def _on_worker_ready(sender=None, **_kwargs) -> None:
    """At start: fail the runs this worker's previous life left `running`, then load the default
    model once (if this worker serves it), so the first task does not pay for loading. Other models
    load on their first task: a worker serving every offered model should not make the default wait
    for a slow first conversion of another."""
    from worker import tasks  # late: tasks imports torch and the engine

    hostname = getattr(sender, "hostname", None) or "unknown"
    tasks.reap_own_runs(hostname)
    queues = [q.name for q in sender.task_consumer.queues] if sender is not None else []
    default_queue = queue_for(get_settings().default_model)
    preload = [q for q in queues if q == default_queue] or [q for q in queues if q.startswith("model.")][:1]
    for name in preload:
        if name.startswith("model."):
            try:
                tasks.get_engine(name.removeprefix("model.")).warm_up()
            except Exception:  # a task on this queue will report the error on its run
                log.exception("could not preload the model of queue %s", name)
    log.info("worker %s ready on %s", hostname, ", ".join(queues))
