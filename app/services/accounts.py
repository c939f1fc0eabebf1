"""Signing in and out, changing a password, and share links: the account actions the pages and the
API call, each one transaction (the rows and rules are `data.accounts` and `data.sign_in`).

A refused sign-in still counts: a wrong password is saved as the action returns, and `SignInLocked`
is one of the refusals the action keeps (`app.services.unit.action`'s `keeps`), so the limit on
failed sign-ins holds across requests. Every action here is an `@action`: none commits by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.services.unit import action
from data import sign_in
from data.accounts import ShareLink, authenticate, create_share, revoke_share, set_password


@dataclass(frozen=True)
class SignedIn:
    """A started session: whom it is for and the secret its cookie carries."""

    user_id: int
    name: str
    secret: str


@action(keeps=(sign_in.SignInLocked,))
def sign_in_user(session: Session, name: str, password: str, address: str | None,
                 max_age_s: int) -> SignedIn | None:
    """A new session for `name`, or None for a wrong name or password (the failure saved). Raises
    `SignInLocked` (the attempt saved) or `HashingBusy` (nothing saved)."""
    sign_in.check_sign_in_allowed(session, name, address)
    user = authenticate(session, name, password)
    if user is None:
        sign_in.note_failure(session, name, address)
        return None
    sign_in.note_success(session, name, address)
    # saved with the session: a rehashed password if argon2's parameters changed
    return SignedIn(user.id, user.name, sign_in.start_session(session, user.id, max_age_s))


@action
def sign_out(session: Session, secret: str) -> None:
    sign_in.end_session(session, secret)


@action(keeps=(sign_in.SignInLocked,))
def change_password(session: Session, name: str, current: str, new: str, keep_secret: str,
                    address: str | None) -> int | None:
    """Set `name`'s password to `new` when `current` is right: the number of their other sessions
    ended, or None for a wrong current password (the failure saved). Raises `SignInLocked` (the
    attempt saved), `HashingBusy` or `AccountError` (a password the rules refuse; nothing saved)."""
    sign_in.check_sign_in_allowed(session, name, address)
    if authenticate(session, name, current) is None:
        sign_in.note_failure(session, name, address)
        return None
    return set_password(session, name, new, keep_session=keep_secret)


@action
def share_run(session: Session, run_id: int, created_by: str | None) -> tuple[ShareLink, str]:
    """A new read-only link to run `run_id`, and its token."""
    return create_share(session, run_id, created_by)


@action
def revoke_link(session: Session, link: ShareLink) -> None:
    revoke_share(session, link)
