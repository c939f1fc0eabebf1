"""An answer's bound on silence, not on queueing (issue 52), apart from the transport that applies
it (`serving.server.Server`): what a server's `/metrics` shows of its work (`Progress`, read through
the backend protocol's `progress`), and the `Follower` that reads it while answers wait and tells the
transport which of them to cut.

An answer waits for its first token, and then for each next one, as long as the server shows
progress: it is cut only once nothing came for `request_s` AND a reading taken after that showed the
server's counters standing still for `request_s` too. A request queued behind other requests'
prefills is alive (on vLLM's CPU backend each 2.7k-token prefill is one engine step of 6-10 s on 2
busy cores, and a request behind five of them waits a minute for its first token); a server whose
counters stand still is stuck. A server without the metrics shows no progress: its answers have the
bound of silence alone.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

FOLLOW_EVERY_S = 5.0  # how often the server's progress is read while an answer waits (less: a short bound)


@dataclass(frozen=True)
class Progress:
    """What a server's `/metrics` shows of its work (`Backend.progress`): the requests it runs and
    the requests it queues now, and its cumulative work: prompt tokens prefilled, tokens generated,
    engine steps, prefix-cache lookups (None: not exported). Two readings that differ mean the server
    did something between them; a server whose readings stand still is doing nothing."""

    running: float | None = None
    waiting: float | None = None
    prompt_tokens: float | None = None
    generated_tokens: float | None = None
    steps: float | None = None
    lookups: float | None = None

    def describe(self) -> str:
        """The reading in words: "2 running, 3 waiting; 8,412 prompt tokens, 96 generated, 40 steps"."""
        now = [f"{v:,.0f} {what}" for v, what in ((self.running, "running"), (self.waiting, "waiting"))
               if v is not None]
        done = [f"{v:,.0f} {what}" for v, what in ((self.prompt_tokens, "prompt tokens"),
                                                   (self.generated_tokens, "generated"),
                                                   (self.steps, "engine steps"),
                                                   (self.lookups, "tokens looked up in its cache"))
                if v is not None]
        return "; ".join(part for part in (", ".join(now), ", ".join(done) + (" in all" if done else ""))
                         if part) or "nothing it reads as progress"


class Watch:
    """One request in flight as the transport's watcher sees it: its socket (once connected), when
    its bound passes (`due`), whether the server's progress moves that bound on (`waits`: an answer
    waiting for its tokens) and, once it was cut for silence, why (`cut`)."""

    __slots__ = ("sock", "due", "waits", "cut")

    def __init__(self, due: float, waits: bool) -> None:
        self.sock: socket.socket | None = None
        self.due, self.waits = due, waits
        self.cut: str | None = None


class Follower:
    """The requests in flight of one server (`add`, `drop`), and its progress read by `read` every
    `FOLLOW_EVERY_S` (at most an eighth of `request_s`) while an answer waits, on a thread of its
    own until `closed` is set. `late(now)` names the sockets past their bound."""

    def __init__(self, request_s: float, read: Callable[[], Progress | None],
                 closed: threading.Event) -> None:
        self.request_s, self._read, self._closed = request_s, read, closed
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()
        # the server's progress as last read: the reading, when it was taken, when one last differed
        self._reading: Progress | None = None
        self._looked_at = self._moved_at = float("-inf")
        self.every_s = min(FOLLOW_EVERY_S, max(0.1, request_s / 8))
        threading.Thread(target=self._follow, name="replay-follow", daemon=True).start()

    def add(self, watch: Watch) -> None:
        with self._lock:
            self._watches.add(watch)

    def drop(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def connected(self, watch: Watch, sock: socket.socket | None) -> None:
        """The request of `watch` has its socket."""
        with self._lock:
            watch.sock = watch.sock or sock

    def going_on(self, watch: Watch) -> None:
        """A token came: the answer has `request_s` again for its next one."""
        with self._lock:
            watch.due = max(watch.due, time.monotonic() + self.request_s)

    def late(self, now: float) -> list[socket.socket]:
        """The sockets of the requests past their bound (the watcher shuts them)."""
        with self._lock:
            return [w.sock for w in self._watches if w.sock is not None and self._late(w, now)]

    def _late(self, watch: Watch, now: float) -> bool:
        """Whether `watch`'s request is past its bound (under the lock). An answer's bound moves on
        while the server shows progress; it is cut once a reading taken after its bound passed shows
        none for `request_s`, and `cut` then says what the server showed."""
        if now <= watch.due:
            return False
        if not watch.waits:
            return True
        if self._moved_at + self.request_s > watch.due:
            watch.due = self._moved_at + self.request_s  # the server worked: it waits on
            if now <= watch.due:
                return False
        if self._looked_at < watch.due:
            return False  # no reading since its bound passed yet: the next one decides
        if self._reading is None:
            shown = "the server showed no progress (no reading of its /metrics)"
        else:
            still = now - max(self._moved_at, watch.due - self.request_s)
            shown = (f"the server showed no progress for {still:.0f} s "
                     f"(its /metrics: {self._reading.describe()})")
        watch.cut = f"nothing came within the request's bound of {self.request_s:g} s, and {shown}"
        return True

    def _follow(self) -> None:
        while not self._closed.wait(self.every_s):
            with self._lock:
                waiting = any(w.waits for w in self._watches)
            if not waiting:
                continue
            looked = time.monotonic()
            try:
                reading = self._read()
            except Exception:  # a reading that cannot be had shows no progress
                reading = None
            with self._lock:
                if reading is not None:
                    if self._reading is not None and reading != self._reading:
                        self._moved_at = looked
                    self._reading = reading
                self._looked_at = looked
