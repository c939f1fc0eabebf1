"""The signed cookies: the session of a signed-in user and the share links a visitor opened.

Both are signed with the secret key (`data.signing`) and sent HttpOnly, SameSite=Lax, and Secure
when the app is served over https (`KVNOTES_HTTPS=1`, or the request came in as https). A session
cookie names the user, the secret of its `user_sessions` row (`data.sign_in`: signing out or
changing the password deletes the row, so the cookie stops working on the server, wherever it was
saved) and the session's CSRF token; it expires after `KVNOTES_SESSION_MAX_AGE` seconds.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from fastapi import Request, Response

from data.settings import get_settings
from data.signing import BadSignature, timed_serializer

SESSION_COOKIE = "kvnotes_session"
SHARE_COOKIE = "kvnotes_share"
MAX_SHARES = 8  # share links one visitor's cookie remembers
_SESSION_SALT = "kvnotes.session"
_SHARE_SALT = "kvnotes.share-cookie"


@dataclass(frozen=True)
class SessionData:
    user_id: int
    name: str
    secret: str  # names the session's row (data.sign_in)
    csrf: str


def _secure(request: Request) -> bool:
    return get_settings().https or request.url.scheme == "https"


def _set(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="lax",
                        secure=_secure(request))


def set_session_cookie(response: Response, request: Request, user_id: int, name: str, secret: str) -> None:
    """The cookie of a session just started (`data.sign_in.start_session`), with a fresh CSRF token."""
    payload = {"u": user_id, "n": name, "s": secret, "c": secrets.token_urlsafe(24)}
    value = timed_serializer(_SESSION_SALT).dumps(payload)
    _set(response, request, SESSION_COOKIE, value, get_settings().session_max_age_s)


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=_secure(request))


def read_session(request: Request) -> SessionData | None:
    raw = request.cookies.get(SESSION_COOKIE)
    if not raw or len(raw) > 4096:
        return None
    try:
        data = timed_serializer(_SESSION_SALT).loads(raw, max_age=get_settings().session_max_age_s)
        return SessionData(int(data["u"]), str(data["n"]), str(data["s"]), str(data["c"]))
    except (BadSignature, KeyError, TypeError, ValueError):
        return None


def read_shares(request: Request) -> list[str]:
    """The share tokens this visitor opened (each still checked against the database)."""
    raw = request.cookies.get(SHARE_COOKIE)
    if not raw or len(raw) > 4096:
        return []
    try:
        tokens = timed_serializer(_SHARE_SALT).loads(raw, max_age=get_settings().session_max_age_s)
    except (BadSignature, TypeError, ValueError):
        return []
    return [t for t in tokens if isinstance(t, str)][:MAX_SHARES] if isinstance(tokens, list) else []


def remember_share(response: Response, request: Request, token: str) -> None:
    tokens = [token, *[t for t in read_shares(request) if t != token]][:MAX_SHARES]
    _set(response, request, SHARE_COOKIE, timed_serializer(_SHARE_SALT).dumps(tokens),
         get_settings().session_max_age_s)
