"""Signing in and out, and opening a read-only share link.

`/login` checks a name and password (argon2, `data.accounts.authenticate`) and starts a signed
session cookie; `/logout` ends it. `/share/<token>` remembers a valid share link in a signed
cookie and opens its run: the visitor reads that run and its report, nothing else. The run page's
"Read-only link" button makes one (`POST /runs/{id}/share`) and can revoke it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.security.cookies import end_session, remember_share, start_session
from app.web.templating import render
from data.accounts import ShareLink, authenticate, create_share, resolve_share, revoke_share
from data.models import Run

router = APIRouter()


def _local_path(target: str | None) -> str:
    """Only a path on this site (no scheme, no `//host`, no backslash tricks) may follow sign-in."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target or len(target) > 2000:
        return "/"
    return target


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    return render(request, "login.html", values={"name": "", "next": _local_path(next)}, errors={}, nav="")


@router.post("/login")
def login(request: Request, session: SessionDep, name: Annotated[str, Form()] = "",
          password: Annotated[str, Form()] = "", next: Annotated[str, Form()] = "/") -> Response:
    user = authenticate(session, name.strip(), password)
    if user is None:
        return render(request, "login.html", 401, values={"name": name[:64], "next": _local_path(next)},
                      errors={"form": "wrong name or password"}, nav="")
    session.commit()  # a rehashed password, if argon2's parameters changed
    response = RedirectResponse(_local_path(next), status_code=303)
    start_session(response, request, user.id, user.name, user.password_hash)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    end_session(response, request)
    return response


@router.get("/share/{token}")
def open_share(request: Request, token: str, session: SessionDep) -> Response:
    link = resolve_share(session, token)
    if link is None:
        return render(request, "login.html", 404, values={"name": "", "next": "/"}, nav="",
                      errors={"form": "this share link is not valid or was revoked; ask for a new one"})
    response = RedirectResponse(f"/runs/{link.run_id}", status_code=303)
    remember_share(response, request, token)
    return response


@router.post("/runs/{run_id}/share")
def make_share(request: Request, run_id: int, session: SessionDep, principal: PrincipalDep) -> Response:
    run = get_or_404(session, Run, run_id, "run")
    link, token = create_share(session, run.id, principal.name)
    session.commit()
    return render(request, "_share_link.html", link=link, run=run, url=f"{request.base_url}share/{token}")


@router.post("/shares/{share_id}/revoke")
def revoke_share_page(request: Request, share_id: int, session: SessionDep) -> Response:
    link = get_or_404(session, ShareLink, share_id, "share link")
    revoke_share(session, link)
    session.commit()
    return render(request, "_share_link.html", link=link, run=session.get(Run, link.run_id), url="(revoked)")
