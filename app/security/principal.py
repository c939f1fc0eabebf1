"""Who is asking: resolved once per request from, in order, a Bearer API token, the session
cookie, the share links this visitor opened, or — only on the embedded default, where nobody
signs in — the single local user.

Sign-in is required unless `KVNOTES_AUTH` is `auto` (the default), the app is bound to a loopback
address (`KVNOTES_BIND_HOST`, set by `kvnotes serve`) AND the request comes from a loopback
client. Behind a proxy on the same host, set `KVNOTES_AUTH=required` (uvicorn passes the proxy's
X-Forwarded-For client on, so a remote client is not loopback either way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fastapi import Request
from sqlalchemy.orm import Session

from app.security.cookies import read_session, read_shares
from data.accounts import LOCAL_USER, User, resolve_share, user_for_token
from data.settings import get_settings, is_loopback
from data.sign_in import live_session


@dataclass(frozen=True)
class Principal:
    """name: the user (or "local", or "share"); role: editor, viewer or share (read one run);
    via: how they were recognised; run_ids: the runs a share visitor may read."""

    name: str
    role: str
    via: str
    run_ids: frozenset[int] = field(default_factory=frozenset)
    csrf: str = ""

    @property
    def can_edit(self) -> bool:
        return self.role == "editor"

    @property
    def signed_in(self) -> bool:
        return self.via in ("session", "token")


class BadToken(Exception):
    """A Bearer token was sent and matches no live token (or is not a token at all)."""


class MalformedAuthorization(BadToken):
    """`Authorization: Bearer …` whose value is not a token (empty, spaces, non-ASCII)."""

    def __init__(self) -> None:
        super().__init__("the Authorization header is malformed: send `Authorization: Bearer <token>`")


_BEARER = re.compile(r"bearer +([A-Za-z0-9\-._~+/]+=*) *", re.IGNORECASE)  # RFC 6750's token68


def sign_in_required(request: Request) -> bool:
    settings = get_settings()
    client = request.client.host if request.client else None
    return settings.auth == "required" or not settings.loopback_bind or not is_loopback(client)


def parse_bearer(header: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>`; None without the header or for another scheme
    (a proxy's Basic). Raises `MalformedAuthorization` for a Bearer header that carries no token:
    such a request is refused, never treated as if it had no header (and its cookie used)."""
    if not header or header[:6].lower() != "bearer":
        return None
    match = _BEARER.fullmatch(header)
    if match is None:
        raise MalformedAuthorization
    return match.group(1)


def bearer_token(request: Request) -> str | None:
    return parse_bearer(request.headers.get("authorization"))


def resolve(request: Request, session: Session) -> Principal | None:
    """The principal of `request`, or None when nobody is recognised (and sign-in is required).
    Raises `BadToken` for a Bearer token that is wrong, revoked or malformed."""
    token = bearer_token(request)
    if token is not None:
        user = user_for_token(session, token)
        if user is None:
            raise BadToken
        return Principal(user.name, user.role, "token")
    data = read_session(request)
    if data is not None:
        user = session.get(User, data.user_id)
        if user is not None and user.name == data.name and live_session(session, user.id, data.secret):
            return Principal(user.name, user.role, "session", csrf=data.csrf)
    if not sign_in_required(request):
        return Principal(LOCAL_USER, "editor", "local")
    run_ids = frozenset(link.run_id for t in read_shares(request) if (link := resolve_share(session, t)))
    if run_ids:
        return Principal("share", "share", "share", run_ids=run_ids)
    return None
