"""Who is asking: resolved once per request from, in order, a Bearer API token, the session
cookie, the share links this visitor opened, or — only on the embedded default, where nobody
signs in — the single local user.

Sign-in is required unless `KVNOTES_AUTH` is `auto` (the default), the app is bound to a loopback
address (`KVNOTES_BIND_HOST`, set by `kvnotes serve`) AND the request comes from a loopback
client. Behind a proxy on the same host, set `KVNOTES_AUTH=required` (uvicorn passes the proxy's
X-Forwarded-For client on, so a remote client is not loopback either way).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from sqlalchemy.orm import Session

from app.security.cookies import password_fingerprint, read_session, read_shares
from data.accounts import LOCAL_USER, User, resolve_share, user_for_token
from data.settings import get_settings, is_loopback


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
    """A Bearer token was sent and matches no live token."""


def sign_in_required(request: Request) -> bool:
    settings = get_settings()
    client = request.client.host if request.client else None
    return settings.auth == "required" or not settings.loopback_bind or not is_loopback(client)


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def resolve(request: Request, session: Session) -> Principal | None:
    """The principal of `request`, or None when nobody is recognised (and sign-in is required).
    Raises `BadToken` for a Bearer token that is wrong or revoked."""
    token = bearer_token(request)
    if token is not None:
        user = user_for_token(session, token)
        if user is None:
            raise BadToken
        return Principal(user.name, user.role, "token")
    data = read_session(request)
    if data is not None:
        user = session.get(User, data.user_id)
        if user is not None and user.name == data.name and password_fingerprint(user.password_hash) == data.fingerprint:
            return Principal(user.name, user.role, "session", csrf=data.csrf)
    if not sign_in_required(request):
        return Principal(LOCAL_USER, "editor", "local")
    run_ids = frozenset(link.run_id for t in read_shares(request) if (link := resolve_share(session, t)))
    if run_ids:
        return Principal("share", "share", "share", run_ids=run_ids)
    return None
