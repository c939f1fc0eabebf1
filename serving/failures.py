"""How a replay fails, in words a user can act on: `ReplayError` (with the field to change),
`ReplayStopped`, what a server answered as a failure quotes it (`answered`: the status and the
first `QUOTED` characters of the body), and the server's root from what a user pastes (`base_url`),
refused before any connection where a replay may never reach it (`serving.targets`). Apart from
the transport (`serving.server`), which raises them, so the pages and commands that only read the
words need none of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import httpx

from serving.targets import TargetRefused, check_target

QUOTED = 200  # the characters of a server's answer a quoting failure shows


class ReplayError(Exception):
    """A replay that cannot run or did not finish, with a message for the user; `field` names what
    to change: "url" (the server), "model", "document" (a prompt too long) or the spec's field."""

    def __init__(self, message: str, field: str = "url") -> None:
        super().__init__(message)
        self.field = field


def base_url(url: str, refused_ports: Iterable[int] = (), resolve: bool = False) -> str:
    """The server's root from what a user pastes: `http://h:p`, `http://h:p/v1` or with a slash;
    `ReplayError` for an address a replay may never reach (`serving.targets`), checked before any
    connection (by the name's addresses too with `resolve`)."""
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ReplayError(f"server URL must start with http:// or https://, got {url[:200]!r}")
    try:
        httpx.URL(url).host.encode("idna")
        check_target(url, refused_ports, resolve=resolve)
    except TargetRefused as exc:
        raise ReplayError(str(exc)) from None
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        raise ReplayError(f"server URL {url[:200]!r} is not a valid address: {exc}") from None
    return url[:-3] if url.endswith("/v1") else url


class ReplayStopped(ReplayError):
    """The replay was stopped from outside (`Server.stop`: cancelled, or past its deadline)."""


def quoted(data: bytes) -> str:
    """The first QUOTED characters of an answer's body, as text."""
    return data[:QUOTED * 4].decode("utf-8", errors="replace")[:QUOTED]


def answered(status: int, data: bytes) -> str:
    """What a server answered, as a failure quotes it: the status and the body's first characters."""
    return f"HTTP {status}: {quoted(data)!r}"
