"""What one worker process holds: its KV store and its loaded engines (one per model, loaded once),
and how a failure is told to a person.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from celery.exceptions import SoftTimeLimitExceeded

from data.settings import get_settings
from worker.engine import Engine, EngineError, load
from worker.engine.devices import parse_max_memory
from worker.engine.models import CONVERTED_MARKER, REAL_MODELS, converted_dir
from worker.engine.store import KVStore


@lru_cache(maxsize=1)
def get_store() -> KVStore:
    """The process's KV store under `<data>/kv`."""
    return KVStore(get_settings().data_dir / "kv")


def get_engine(alias: str) -> Engine:
    """The engine for `alias` on the settings' device and in their dtype, loaded once per process
    (the engine caches it), with the process's KV store."""
    settings = get_settings()
    return load(alias, device=settings.device or None, dtype=settings.dtype or None, store=get_store(),
                data_dir=settings.data_dir, max_memory=parse_max_memory(settings.max_memory))


def loading_stage(alias: str) -> str:
    """What loading `alias` takes now: "converting ALIAS" for a bundled model not yet converted
    under the data folder (a minute or more, once), else "loading ALIAS"."""
    marker = converted_dir(alias, get_settings().data_dir) / CONVERTED_MARKER
    if alias in REAL_MODELS and not marker.exists():
        return f"converting {alias}"
    return f"loading {alias}"


def describe_failure(exc: BaseException, device: str, stage: str) -> str:
    """One line a person can act on."""
    if isinstance(exc, EngineError):
        return str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return (
            f"out of memory on {device} during {stage}: try fewer strategies, a shorter document "
            "or a smaller model"
        )
    if isinstance(exc, SoftTimeLimitExceeded):
        return f"stopped after the time limit of {get_settings().task_time_limit_s} s during {stage}"
    return f"worker error: {type(exc).__name__}: {exc}"
