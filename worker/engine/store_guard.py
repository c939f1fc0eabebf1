"""The KV store is a cache: any failure of it costs time, never a run.

`CacheGuard` turns an I/O failure of the store (a damaged or deleted index, a full disk, missing
permissions) into "no cache this time": the caller computes without it, and the failure is logged
once (again only after the store worked in between). A store whose disk keeps failing is left alone
for `COOLDOWN_S` instead of being retried on every call: the project's one circuit breaker
(`vocabulary.breaker.Breaker`), open for that long, then one call let through as a probe. A
damaged or missing index is quarantined (moved to `<root>/quarantine/`) and rebuilt from the block
files on disk (`scan_files`); the files themselves carry their own checksums, so nothing unverified
is ever served.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from vocabulary.breaker import Breaker

log = logging.getLogger("worker.engine.store")

COOLDOWN_S = 30.0
Entry = tuple[str, str, int]  # (key, kind, bytes)


def is_damaged_index(exc: BaseException) -> bool:
    """A corrupt, truncated, replaced or deleted index file (not a busy or full one)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    text = str(exc).lower()
    if isinstance(exc, sqlite3.OperationalError):
        return "no such table" in text or "malformed" in text
    return True  # "file is not a database", "database disk image is malformed", ...


class CacheGuard:
    """Log-once bookkeeping and a cool-down (a `Breaker`) for one store."""

    def __init__(self) -> None:
        self._logged: set[str] = set()
        self.breaker = Breaker("kv store", COOLDOWN_S)

    def available(self) -> bool:
        """False while cooling down; True lets this call through (the probe, once the time passed)."""
        return self.breaker.allow()

    def fault(self, what: str, exc: BaseException, cooldown: bool = True) -> None:
        """Record a failure; log it once per kind; optionally rest the store for `COOLDOWN_S`."""
        kind = f"{what}:{type(exc).__name__}:{getattr(exc, 'errno', '')}"
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("kv store: failed; runs compute without the cache",
                        extra={"doing": what, "reason": f"{type(exc).__name__}: {exc}"})
        if cooldown:
            self.breaker.failure()

    def ok(self) -> None:
        self.breaker.success()
        if self._logged:
            log.info("kv store: working again")
            self._logged.clear()


def quarantine(index_path: Path) -> Path | None:
    """Move a damaged index (and its -wal/-shm files) to `quarantine/`; where it went, or None."""
    if not index_path.exists():
        return None
    folder = index_path.parent / "quarantine"
    folder.mkdir(exist_ok=True)
    target = folder / (f"{index_path.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
                       f"-{time.monotonic_ns() % 10**6}.sqlite")
    for suffix in ("", "-wal", "-shm"):
        part = Path(str(index_path) + suffix)
        if part.exists():
            part.replace(Path(str(target) + suffix))
    log.warning("kv store: damaged index moved aside", extra={"path": str(target)})
    return target


def scan_files(root: Path) -> list[Entry]:
    """Every stored file under `root` as an index entry (stray `.tmp` files are deleted)."""
    entries: list[Entry] = []
    for folder, kind in (("blocks", "block"), ("seqs", "seq")):
        for path in sorted((root / folder).glob("*/*")):
            if path.suffix == ".tmp":
                path.unlink(missing_ok=True)
            elif path.suffix == ".safetensors":
                entries.append((path.stem, kind, path.stat().st_size))
    return entries
