"""Signing in and out, and opening a read-only share link.

`/login` checks a name and password (argon2, `data.accounts.authenticate`), within the limit on
failed sign-ins (`data.sign_in`: 429 with Retry-After and the same words on the page), and starts
a session (a row, and a signed cookie naming it); `/logout` ends that session on the server.
`/account/password` changes the signed-in user's password and ends their other sessions.
`/share/<token>` remembers a valid share link in a signed cookie and opens its run: the visitor
reads that run and its report, nothing else. The run page's "Read-only link" button makes one
(`POST /runs/{id}/share`) and can revoke it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import PrincipalDep, SessionDep, get_or_404
from app.security.cookies import clear_session_cookie, read_session, remember_share, set_session_cookie
from app.security.principal import sign_in_required
from app.services import accounts as actions
from app.web.errors import error_page
from app.web.templating import render
from data import sign_in
from data.accounts import AccountError, HashingBusy, ShareLink, count_users, resolve_share
from data.models import Run
from data.settings import get_settings
from vocabulary.text_rules import text_problem

router = APIRouter()


def _local_path(target: str | None) -> str:
    """Only a path on this site (no scheme, no `//host`, no backslash tricks) may follow sign-in."""
    if (not target or not target.startswith("/") or target.startswith("//") or "\\" in target
            or len(target) > 2000):
        return "/"
    return target


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    return render(request, "login.html", values={"name": "", "next": _local_path(next)}, errors={}, nav="")


def _client(request: Request) -> str | None:
    return request.client.host if request.client else None


def _login_form(request: Request, status: int, message: str, name: str, next_path: str,
                retry_after_s: int | None = None) -> Response:
    values = {"name": name[:64], "next": _local_path(next_path)}
    response = render(request, "login.html", status, values=values, errors={"form": message}, nav="")
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    return response


@router.post("/login")
def login(request: Request, session: SessionDep, name: Annotated[str, Form()] = "",
          password: Annotated[str, Form()] = "", next: Annotated[str, Form()] = "/") -> Response:
    name = name.strip()
    problem = text_problem(name, 64)  # the text rules: a name that breaks them names no account
    if problem:
        return _login_form(request, 422, f"name: {problem}", name, next)
    try:
        signed = actions.sign_in_user(session, name, password, _client(request),
                                      get_settings().session_max_age_s)
    except sign_in.SignInLocked as exc:  # the refused attempt counts (saved)
        return _login_form(request, 429, str(exc), name, next, exc.retry_after_s)
    except HashingBusy as exc:
        return _login_form(request, 503, str(exc), name, next, exc.retry_after_s)
    if signed is None:
        return _login_form(request, 401, "wrong name or password", name, next)
    response = RedirectResponse(_local_path(next), status_code=303)
    set_session_cookie(response, request, signed.user_id, signed.name, signed.secret)
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep) -> Response:
    data = read_session(request)
    if data is not None:
        actions.sign_out(session, data.secret)
    response = RedirectResponse("/login", status_code=303)
    clear_session_cookie(response, request)
    return response


def _password_page(request: Request, status: int = 200, errors: dict[str, str] | None = None,
                   done: str = "", retry_after_s: int | None = None) -> Response:
    response = render(request, "password.html", status, errors=errors or {}, done=done, nav="")
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    return response


def _session_user(request: Request, principal: PrincipalDep) -> str:
    """The name of the user signed in by a session cookie (only they have a password to change here)."""
    if principal.via != "session" or read_session(request) is None:
        raise HTTPException(status_code=404, detail="no account is signed in here: nobody signs in on the "
                            "embedded default (kvnotes users passwd NAME changes any user's password)")
    return principal.name


@router.get("/account/password")
def password_page(request: Request, principal: PrincipalDep) -> Response:
    _session_user(request, principal)
    return _password_page(request)


@router.post("/account/password")
def change_password(request: Request, session: SessionDep, principal: PrincipalDep,
                    current: Annotated[str, Form()] = "", new: Annotated[str, Form()] = "",
                    again: Annotated[str, Form()] = "") -> Response:
    name = _session_user(request, principal)
    if new != again:
        return _password_page(request, 422, {"again": "the two new passwords differ"})
    try:
        ended = actions.change_password(session, name, current, new, read_session(request).secret,
                                        _client(request))
        if ended is None:
            return _password_page(request, 401, {"current": "wrong password"})
    except sign_in.SignInLocked as exc:
        return _password_page(request, 429, {"form": str(exc)}, retry_after_s=exc.retry_after_s)
    except HashingBusy as exc:
        return _password_page(request, 503, {"form": str(exc)}, retry_after_s=exc.retry_after_s)
    except AccountError as exc:
        return _password_page(request, 422, {"new": str(exc).removeprefix("password: ")})
    return _password_page(request, done=f"Password changed; {ended} other session(s) signed out.")


@router.get("/share/{token}")
def open_share(request: Request, token: str, session: SessionDep) -> Response:
    link = resolve_share(session, token)
    if link is None:
        message = ("This share link was revoked, or is not a link this site made: ask whoever sent it "
                   "for a new one.")
        if count_users(session) and sign_in_required(request):  # someone with an account may sign in
            return render(request, "login.html", 404, values={"name": "", "next": "/"}, nav="",
                          errors={"form": message})
        return error_page(request, 404, message, title="Share link revoked")
    response = RedirectResponse(f"/runs/{link.run_id}", status_code=303)
    remember_share(response, request, token)
    return response


@router.post("/runs/{run_id}/share")
def make_share(request: Request, run_id: int, session: SessionDep, principal: PrincipalDep) -> Response:
    run = get_or_404(session, Run, run_id, "run")
    link, token = actions.share_run(session, run.id, principal.name)
    return render(request, "_share_link.html", link=link, run=run, url=f"{request.base_url}share/{token}")


@router.post("/shares/{share_id}/revoke")
def revoke_share_page(request: Request, share_id: int, session: SessionDep) -> Response:
    link = get_or_404(session, ShareLink, share_id, "share link")
    actions.revoke_link(session, link)
    return render(request, "_share_link.html", link=link, run=session.get(Run, link.run_id), url="(revoked)")
