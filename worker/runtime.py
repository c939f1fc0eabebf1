"""What one worker process holds: its KV store and its loaded engines (one per model, loaded once),
and how a failure is told to a person.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable
from functools import lru_cache

import torch
from celery.exceptions import SoftTimeLimitExceeded

from data.settings import get_settings
from worker.engine import Engine, EngineError, load
from worker.engine.devices import parse_max_memory
from worker.engine.models import TensorProgress, conversion_stage, ensure_converted, needs_conversion
from worker.engine.store import KVStore
from worker.engine.store_s3 import SharedConfig

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def get_store() -> KVStore:
    """The process's KV store under `<data>/kv`, with the shared tier of `KVNOTES_STORE_URL` behind
    it when set."""
    return open_store()


def open_store(url: str = "") -> KVStore:
    """A KV store under `<data>/kv` with the shared tier of `url` (else `KVNOTES_STORE_URL`) behind
    it; its background writes are drained (at most 30 s, else abandoned, said in the log) and its
    threads joined when the process exits."""
    store = KVStore(get_settings().data_dir / "kv", shared=shared_config(url))
    if store.shared is not None:
        atexit.register(store.close, True, 30.0)
    return store


def shared_config(url: str = "") -> SharedConfig | None:
    """The shared KV tier at `url` (else the settings' KVNOTES_STORE_URL) as the engine takes it, or
    None when neither is set. Its index is KVNOTES_STORE_INDEX, else the broker's Redis (none: no
    budget is enforced)."""
    settings = get_settings()
    url = url or settings.store_url
    if not url:
        return None
    index = settings.store_index_url
    if not index and settings.broker_url.startswith(("redis://", "rediss://")):
        index = settings.broker_url
    return SharedConfig(url=url, endpoint=settings.s3_endpoint,
                        budget_bytes=settings.store_shared_bytes, index_url=index,
                        timeout_s=settings.store_timeout_s, upload_bytes=settings.store_upload_bytes)


def get_engine(alias: str, say: Callable[[str], None] | None = None) -> Engine:
    """The engine for `alias` on the settings' device and in their dtype, loaded once per process
    (the engine caches it), with the process's KV store. While a bundled model converts on first use,
    `say` hears "converting ALIAS (first use): k of n tensors" (`converting`)."""
    settings = get_settings()
    return load(alias, device=settings.device or None, dtype=settings.dtype or None, store=get_store(),
                data_dir=settings.data_dir, max_memory=parse_max_memory(settings.max_memory),
                progress=converting(alias, say) if say is not None else None)


def loading_stage(alias: str) -> str:
    """What loading `alias` takes now: "converting ALIAS (first use)" for a bundled model not yet
    converted under the data folder (a minute or more, once), else "loading ALIAS"."""
    if needs_conversion(alias, get_settings().data_dir):
        return conversion_stage(alias)
    return f"loading {alias}"


def converting(alias: str, say: Callable[[str], None], step: float = 0.02) -> TensorProgress:
    """A conversion's tensor counts told to `say` as a stage: at the first tensor, the last, and
    every `step` of the way between (not one database write per tensor)."""
    last = {"step": -1}

    def heard(done: int, total: int) -> None:
        at = int(done / max(total, 1) / step)
        if done in (1, total) or at != last["step"]:
            last["step"] = at
            say(conversion_stage(alias, done, total))

    return heard


def convert_bundled(models: list[str], say: Callable[[str], None]) -> list[str]:
    """Convert every bundled model of `models` not yet converted (the worker's start: health says
    "starting: converting …" until each is done, so the first run of either model does not wait);
    the ones converted. A failure is logged; that model's first run reports it."""
    done = []
    for alias in models:
        if not needs_conversion(alias, get_settings().data_dir):
            continue
        say(conversion_stage(alias))
        try:
            ensure_converted(alias, get_settings().data_dir, converting(alias, say))
            done.append(alias)
        except Exception:
            log.exception("could not convert a bundled model", extra={"model": alias})
    return done


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
