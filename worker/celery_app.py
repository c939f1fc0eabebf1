"""The one Celery app of the worker side, configured from `data.settings`.

A worker process owns its model(s): it runs the solo pool (one task at a time in the main process —
CUDA cannot be forked, and a model per process is the unit of scale), takes one message at a time
(`worker_prefetch_multiplier=1`) and acknowledges a message only when its task has finished
(`task_acks_late` + `task_reject_on_worker_lost`), so a worker that dies mid-run leaves the message
to be delivered again where the broker can do that (Redis: after `visibility_timeout`; the embedded
SQLAlchemy broker cannot — it marks a message invisible when it hands it out — so there the
watchdog marks the run failed instead).

The solo pool does not enforce Celery's time limits (they are set for other pools and for
introspection); every task stops its job past its deadline (`data.jobs.deadline_s`) at its next
step, and `kvnotes serve` replaces a worker stuck inside a step (`commands.supervisor`).

The embedded SQLAlchemy broker cannot push: its worker polls it, once a second by kombu's default,
which a run then waits half of on average. `_BrokerPolling` sets the consumer's transport to poll
every `broker_poll_interval_s` instead (kombu's SQLAlchemy transport hands every transport option to
`create_engine`, so it cannot go through `broker_transport_options`). Redis pushes and ignores it.

Queues are per model, `model.<alias>`; the web side (`data.queue`) sends each task to the queue of
the run's model, and `kvnotes worker --model M` consumes `model.M`. The tasks live in
`worker.tasks`, `worker.replay_task` and `worker.trajectory_task`, which Celery imports by name
(`include`); this module imports no task. Its logs are key=value lines with their `extra` fields
(`data.logs`), like the web app's.
"""

from __future__ import annotations

from celery import Celery, bootsteps
from celery.signals import setup_logging

from data.logs import configure_logging
from data.queue import celery_config
from data.settings import get_settings

__all__ = ["app", "make_celery"]


class _BrokerPolling(bootsteps.StartStopStep):
    """Poll a polled broker every `broker_poll_interval_s` (see the module doc)."""

    requires = {"celery.worker.consumer.connection:Connection"}

    def start(self, consumer) -> None:
        transport = consumer.connection.transport
        if hasattr(transport, "polling_interval") and not transport.implements.asynchronous:
            transport.polling_interval = get_settings().broker_poll_interval_s


@setup_logging.connect
def _structured_logs(loglevel: int | str | None = None, **_kwargs: object) -> None:
    """The worker logs as the web app does: key=value lines with their extra fields (`data.logs`);
    connecting here keeps Celery from installing its own handlers."""
    configure_logging(loglevel or "INFO")


def make_celery() -> Celery:
    """Build the app from the current settings (tests call it again after changing the env)."""
    settings = get_settings()
    limit = settings.task_time_limit_s
    celery = Celery("kvnotes", include=["worker.tasks", "worker.replay_task", "worker.trajectory_task"])
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
        broker_connection_retry_on_startup=True,
        result_expires=24 * 3600,
        task_track_started=False,  # the runs table is the source of truth for progress
    )
    celery.steps["consumer"].add(_BrokerPolling)
    return celery


app = make_celery()
