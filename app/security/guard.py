"""The authorization gate: a dependency of every route (`app.main` adds it to the whole app).

- Public: the sign-in page, signing out, opening a share link, `/api/health`, `/openapi.json`.
- Nobody recognised (sign-in required): the JSON API answers 401 (`WWW-Authenticate: Bearer`);
  a page asks the browser to sign in (303 to /login, or `HX-Redirect` for htmx).
- A share visitor reads only the runs of the links they opened (`/runs/{id}…`, `/api/runs/{id}…`).
- A viewer reads everything and changes nothing (403 on POST/PUT/PATCH/DELETE).
- A signed-in browser session must prove its requests are its own (CSRF): the middleware has
  already refused cross-site requests by Origin / Sec-Fetch-Site; a session request carrying
  neither header must carry the session's token in `X-CSRF-Token` (the pages' htmx sends it).
"""

from __future__ import annotations

import hmac
from urllib.parse import quote

from fastapi import HTTPException, Request

from app.api.deps import SessionDep
from app.security.principal import BadToken, Principal, resolve

PUBLIC_PATHS = frozenset({"/login", "/logout", "/api/health", "/openapi.json"})
PUBLIC_PREFIXES = ("/share/",)
GATEWAY_API = ("/gateway/v1/", "/gateway/metrics")  # held for minutes: no database connection held
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SHARE_ROUTES = ("/runs/{run_id}", "/api/runs/{run_id}")


class SignInRequired(Exception):
    """A page asked for by nobody: the handler sends the browser to /login."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def _is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _is_api(path: str) -> bool:
    return path.startswith(("/api/", "/gateway/v1/")) or path in ("/api", "/gateway/metrics")


def _share_allows(principal: Principal, request: Request) -> bool:
    route = request.scope.get("route")
    template = getattr(route, "path", "")
    if (request.method not in SAFE_METHODS or not template.startswith(SHARE_ROUTES)
            or template.endswith("/shares")):
        return False
    try:
        return int(request.path_params.get("run_id", -1)) in principal.run_ids
    except (TypeError, ValueError):
        return False


def _check_csrf(principal: Principal, request: Request) -> None:
    if principal.via != "session" or request.method in SAFE_METHODS:
        return
    browser = request.headers.get("origin") or request.headers.get("sec-fetch-site")
    sent = request.headers.get("x-csrf-token", "")
    if not browser and not hmac.compare_digest(sent.encode(), principal.csrf.encode()):
        raise HTTPException(status_code=403,
                            detail="CSRF token missing or wrong: reload the page and try again")


def authorize(request: Request, session: SessionDep) -> Principal | None:
    """Resolve the principal (kept in `request.state.principal`) and apply the rules above."""
    try:
        principal = resolve(request, session)
    except BadToken as exc:
        raise HTTPException(status_code=401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
                            detail=str(exc) or "the API token is wrong or revoked "
                                                 "(kvnotes tokens create NAME)") from None
    request.state.principal = principal
    path = request.url.path
    if path.startswith(GATEWAY_API):  # it may be held for minutes: its connection goes back now
        session.close()
    if _is_public(path):
        return principal
    if principal is None:
        if _is_api(path):
            raise HTTPException(status_code=401, detail="sign in: send Authorization: Bearer <token> "
                                "(kvnotes tokens create NAME)", headers={"WWW-Authenticate": "Bearer"})
        raise SignInRequired(path + (f"?{request.url.query}" if request.url.query else ""))
    if principal.role == "share":
        if _share_allows(principal, request):
            return principal
        if _is_api(path):
            raise HTTPException(status_code=401, detail="a share link shows one run only; sign in for more",
                                headers={"WWW-Authenticate": "Bearer"})
        raise SignInRequired(path)
    _check_csrf(principal, request)
    if not principal.can_edit and request.method not in SAFE_METHODS:
        raise HTTPException(status_code=403,
                            detail=f"{principal.name} is a viewer: viewers read, editors change")
    return principal


def login_url(next_path: str) -> str:
    return "/login?next=" + quote(next_path, safe="/")
