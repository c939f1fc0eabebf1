"""Stored renders of finished runs: a finished run never changes, so its report, exports and
painted attention views are built once and kept under the data folder, `<data>/renders/<run tag>/`
(the run's id and creation time: a run id may be issued again after its run was deleted), one
file per render, named by a digest of what the request names (the kind of render and the
view's parameters) and the version of the code that built it (`app.web.runs.render_cache` says
which). A file holds a small JSON header (media type, ETag, the headers that go with the bytes)
and the bytes; it is written to a temporary name and renamed, so several web processes never read
half a render. It is a cache: deleting the folder costs a render again, never a run.

Bounds: at most `MAX_RENDERS_PER_RUN` files per run (views are many: layer × head × query; the
oldest go first), and a run's folder goes once the run is gone (checked whenever a render is
stored, against the database). A finished trajectory's report is kept the same way, under
`trajectory-<id>-<created>/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from data.models import Run, as_utc
from data.settings import get_settings
from data.trajectories import Trajectory

MAX_RENDERS_PER_RUN = 32


@dataclass(frozen=True)
class Render:
    """What a render answers: its bytes, their media type, the headers that go with them (a CSP, a
    Content-Disposition) and their ETag."""

    body: bytes
    media_type: str
    etag: str
    headers: dict[str, str] = field(default_factory=dict)


def renders_dir() -> Path:
    return get_settings().data_dir / "renders"


TRAJECTORY = "trajectory"  # the prefix of a trajectory's folder (a run's folder has none)


def run_tag(run: Run | Trajectory) -> str:
    """The folder name of `run`'s renders: `<id>-<created, µs since the epoch>`; a trajectory's
    (its report) `trajectory-<id>-<created>`."""
    created = as_utc(run.created_at)
    tag = f"{int(run.id)}-{round(created.timestamp() * 1e6) if created else 0}"
    return f"{TRAJECTORY}-{tag}" if isinstance(run, Trajectory) else tag


def _path(tag: str, key: str, version: str) -> Path:
    name = hashlib.sha256(f"{version}\0{key}".encode()).hexdigest()[:40]
    return renders_dir() / tag / f"{name}.render"


def find_render(tag: str, key: str, version: str) -> Render | None:
    """The stored render of the run `tag` under `key` built by `version`, or None (also when
    unreadable)."""
    try:
        raw = _path(tag, key, version).read_bytes()
        head, body = raw.split(b"\n", 1)
        meta = json.loads(head)
        if meta.get("key") != key or meta.get("version") != version:
            return None
        return Render(body, str(meta["media_type"]), str(meta["etag"]), dict(meta.get("headers") or {}))
    except (OSError, ValueError, KeyError):
        return None


def put_render(tag: str, key: str, version: str, render: Render) -> None:
    """Keep a render (atomically; the run's oldest beyond `MAX_RENDERS_PER_RUN` go). Raises OSError
    when the data folder cannot be written."""
    path = _path(tag, key, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({"key": key, "version": version, "media_type": render.media_type, "etag": render.etag,
                       "headers": render.headers}, ensure_ascii=True).encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head + b"\n" + render.body)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    kept = sorted(path.parent.glob("*.render"), key=lambda p: p.stat().st_mtime)
    for old in kept[:max(0, len(kept) - MAX_RENDERS_PER_RUN)]:
        old.unlink(missing_ok=True)


def forget_gone_runs(session: Session) -> list[str]:
    """Delete the render folders of runs (and trajectories) that no longer exist; their tags."""
    folder = renders_dir()
    if not folder.is_dir():
        return []
    names = [p.name for p in folder.iterdir() if p.is_dir()]
    gone: list[str] = []
    for kind, prefix in ((Run, ""), (Trajectory, f"{TRAJECTORY}-")):
        stored = {name: int(name[len(prefix):].split("-", 1)[0]) for name in names
                  if name.startswith(prefix) and name[len(prefix):].split("-", 1)[0].isdigit()}
        if stored:
            rows = session.scalars(select(kind).where(kind.id.in_(set(stored.values()))))
            gone += sorted(set(stored) - {run_tag(row) for row in rows})
    for tag in gone:
        shutil.rmtree(folder / tag, ignore_errors=True)
    return gone
