"""One circuit breaker for every shared dependency (the gateway's Redis state, the KV store's shared
tier and its index, the local store): closed while the dependency answers; open for `retry_s` after a
fault, so a dependency that hangs costs one timeout, not one per call; then half-open: the next
caller is let through alone as a probe, and its outcome closes or re-opens the breaker.

Standard library only, thread-safe, no threads of its own. `clock` is injectable for tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


class Breaker:
    """`allow()` before a call; then `success()` or `failure()`.

    While open, `allow()` is False (the caller treats it as a miss or a pass-through). Once `retry_s`
    has passed, one `allow()` returns True (half-open: the probe) and the others stay False until the
    probe reports; a probe that never reports is given up after another `retry_s`."""

    def __init__(self, name: str, retry_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if retry_s < 0:
            raise ValueError(f"breaker {name!r}: retry_s must be >= 0, got {retry_s}")
        self.name = name
        self.retry_s = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._until = 0.0  # open: when a probe may go; half_open: when an unanswered probe is given up
        self.failures = 0  # total faults recorded
        self.opened = 0  # times it opened

    @property
    def state(self) -> BreakerState:
        with self._lock:
            if self._state == "open" and self._clock() >= self._until:
                return "half_open"
            return self._state

    @property
    def down(self) -> bool:
        """True while calls are refused (open, or half-open with its probe out)."""
        with self._lock:
            now = self._clock()
            if self._state == "open":
                return now < self._until
            if self._state == "half_open":
                return now < self._until
            return False

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            if self._state == "closed":
                return True
            if now < self._until:
                return False
            # open past retry_s, or a half-open probe that never reported: this caller probes
            self._state = "half_open"
            self._until = now + self.retry_s
            return True

    def success(self) -> None:
        with self._lock:
            self._state = "closed"
            self._until = 0.0

    def failure(self) -> None:
        with self._lock:
            self.failures += 1
            if self._state != "open":
                self.opened += 1
            self._state = "open"
            self._until = self._clock() + self.retry_s

    def reset(self) -> None:
        self.success()
