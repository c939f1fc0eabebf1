"""What every replay does around its requests, written once for the edit replay (`serving.replay`)
and the trajectory replay (`serving.trajectory`): open the backend within the replay's bounds, check
every prompt fits the server before the first request, and, per variant, empty the prefix cache and
send the unmeasured warm request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from serving.backend import Backend, EngineBackend, connect
from serving.server import Counters, ReplayError, ReplayStopped


@dataclass(frozen=True)
class Bounds:
    """How long a replay may take: to connect, for each answer (the silence before its first token,
    then between its tokens, while the server shows no progress either: `serving.server.Server`),
    and in all (None: no overall bound);
    the ports it may never reach besides `serving.targets.SERVICE_PORTS`; and whether a failure
    quotes what the server answered (`quote`: the command line, on the operator's own server; never
    on the web, where a replay must not read other services)."""

    connect_s: float = 10.0
    request_s: float = 120.0
    replay_s: float | None = None
    refused_ports: tuple[int, ...] = ()
    quote: bool = False


def open_backend(url: str, model: str | None, bounds: Bounds, stop: threading.Event | None = None,
                 engine: str = "vllm") -> EngineBackend:
    """The backend a replay talks to, bounded by `bounds`, stopped by `stop`."""
    return connect(url, model, engine=engine, timeout_s=bounds.request_s, connect_s=bounds.connect_s,
                   deadline_s=bounds.replay_s, refused_ports=bounds.refused_ports, stop_event=stop,
                   quote=bounds.quote)


def checked_lengths(server: Backend, prompts: Iterable[tuple[str, str, str]], max_tokens: int,
                    max_model_len: int, shorten: str, field: str) -> dict[str, list[int]]:
    """Every prompt's token ids, after checking each fits the server. `prompts`: (variant, what,
    content) triples; `shorten` says what to shorten and `field` is the field a refusal names."""
    ids: dict[str, list[int]] = {}
    for variant, what, content in prompts:
        if content not in ids:
            ids[content] = server.prompt_tokens(content)
        if max_model_len and len(ids[content]) + max_tokens > max_model_len:
            raise ReplayError(f"{variant} {what}: the prompt is {len(ids[content])} tokens and the "
                              f"answer up to {max_tokens}, beyond the server's max_model_len of "
                              f"{max_model_len}; shorten {shorten} or start the server with a "
                              "larger --max-model-len", field)
    return ids


def warm_up(server: Backend, variant: str, warm: str, max_tokens: int,
            choices: tuple[str, ...]) -> tuple[bool, Counters | None]:
    """Empty the prefix cache where the server allows, send the warm request (unmeasured); whether
    the cache was emptied, and the counters after the warm request."""
    cache_reset = server.reset_cache()
    try:
        server.complete(warm, max_tokens, choices)
    except ReplayStopped:
        raise
    except ReplayError as exc:
        raise ReplayError(f"{variant} warm-up request failed: {exc}") from None
    return cache_reset, server.counters()


def delta(before: Counters | None, after: Counters | None) -> float | None:
    """The hit rate between two readings of the counters (None when nothing was looked up)."""
    if before is None or after is None or after.queries <= before.queries:
        return None
    return (after.hits - before.hits) / (after.queries - before.queries)
