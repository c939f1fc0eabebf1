"""Heavy pages are cheap to repeat and bounded: a finished run's renders (its report, exports and
painted attention views) are built once, stored (`data.renders`) and served again with an ETag;
building one takes a heavy-render slot, of which each signed-in user and each shared run has
`KVNOTES_MAX_HEAVY_RENDERS` per web process (beyond them: 503 with Retry-After at once), so a crowd
on one share link cannot hold every request slot while signed-in users wait. Renders are kept
under the data folder, not in the database: a cache, shared by the web processes of one machine.

This layer sits around the rendered bytes, whatever builds them: a route hands `cached` the kind
of render, the query parameters that shape it and a function returning the Response. The key is
the run id, the kind, those parameters (sorted) and a version: `RENDER_VERSION` with a digest of
the code and templates that draw pages, so a changed template or view never serves old bytes.
Only finished runs (succeeded, failed, cancelled) are stored; a run still queued or running is
built every time (its page changes). Stored renders go with their run, at most
`data.renders.MAX_RENDERS_PER_RUN` per run.

A stored render is sent with `Cache-Control: private, no-cache`: a browser keeps it for this user
only and asks again with `If-None-Match`, answered 304 without a body.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from urllib.parse import urlencode

from fastapi import HTTPException, Request, Response
from sqlalchemy.orm import Session

from app.services.renders import keep_render, stored_render
from app.web.templating import ROOT
from data.models import Run, RunStatus
from data.renders import Render
from data.settings import get_settings
from data.trajectories import Trajectory

RENDER_VERSION = "2"  # bump when a render changes in a way the digest of the sources cannot see
FINISHED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
VIEW = ("strategy", "layer", "head", "agg", "query")  # the parameters of an attention view
SOURCES = ("app", "templates", "static", "vocabulary", "data")
SOURCE_SUFFIXES = frozenset({".py", ".html", ".css", ".js", ".json", ".svg"})
RETRY_AFTER_S = 5
WAIT_S = 5.0  # how long a heavy render waits for its holder's slot before 503
KEPT_HEADERS = ("content-security-policy", "content-disposition")
CACHE_CONTROL = "private, no-cache"


class _Slots:
    """Heavy renders in progress in this process, per holder (a user, or a shared run)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.held: Counter[str] = Counter()

    @contextmanager
    def take(self, holder: str, cap: int, wait_s: float = WAIT_S) -> Iterator[None]:
        """A slot of `holder`'s, waiting up to `wait_s` for one (a page's own panels ask together),
        else 503 with Retry-After."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.held[holder] < cap, timeout=wait_s):
                raise HTTPException(
                    status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                    detail=(f"{cap} heavy pages of this run are being built for you already "
                            "(reports, exports, attention views); try again in a few seconds"))
            self.held[holder] += 1
        try:
            yield
        finally:
            with self._lock:
                self.held[holder] -= 1
                if self.held[holder] <= 0:
                    del self.held[holder]
                self._lock.notify_all()


SLOTS = _Slots()


@lru_cache(maxsize=1)
def code_version() -> str:
    """`RENDER_VERSION` and a digest of every source that draws a page (read once per process)."""
    digest = hashlib.sha256(RENDER_VERSION.encode())
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return f"{RENDER_VERSION}-{digest.hexdigest()[:20]}"


def holder(request: Request, run_id: int) -> str:
    """Whose heavy-render slots a request uses: its user's, or its shared run's for a share visitor
    (every holder of one run's share links together)."""
    principal = getattr(request.state, "principal", None)
    if principal is None:
        return "anonymous"
    return f"share:{run_id}" if principal.role == "share" else f"user:{principal.name}"


def render_key(kind: str, request: Request, names: tuple[str, ...]) -> str:
    """`kind` and the query parameters among `names` that the request sets, sorted."""
    params = sorted((name, request.query_params[name]) for name in names if name in request.query_params)
    return f"{kind}?{urlencode(params)}" if params else kind


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


def _answer(request: Request, render: Render) -> Response:
    headers = {**render.headers, "ETag": render.etag, "Cache-Control": CACHE_CONTROL}
    if _matches(request.headers.get("if-none-match"), render.etag):
        return Response(status_code=304, headers={"ETag": render.etag, "Cache-Control": CACHE_CONTROL})
    return Response(render.body, media_type=render.media_type, headers=headers)


def cached(request: Request, session: Session, run: Run | Trajectory, kind: str,
           build: Callable[[], Response], names: tuple[str, ...] = ()) -> Response:
    """The render `kind` of `run` (or of a trajectory: its report) for the parameters `names` of this
    request: stored (a finished one's, built before by this version) or built now under a
    heavy-render slot, then stored."""
    finished = run.status in FINISHED
    key, version = render_key(kind, request, names), code_version()
    if finished and (found := stored_render(run, key, version)) is not None:
        return _answer(request, found)
    with SLOTS.take(holder(request, run.id), get_settings().max_heavy_renders):
        response = build()
    if not finished or response.status_code != 200:
        return response
    body = bytes(response.body)
    kept = {name: value for name, value in response.headers.items() if name.lower() in KEPT_HEADERS}
    render = Render(body, response.headers.get("content-type", response.media_type or ""), _etag(body), kept)
    keep_render(session, run, key, version, render)
    return _answer(request, render)
