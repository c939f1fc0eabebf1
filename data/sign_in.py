"""Signing in on a shared server: sessions that end, and a limit on failed sign-ins.

- Sessions: one `user_sessions` row per sign-in. The cookie carries a random secret; only its
  SHA-256 is stored. A request's session is live while its row exists and has not expired, so
  signing out (`end_session`) or changing the password (`end_other_sessions`) ends it on the
  server: a cookie saved before is refused from then on.
- Failed sign-ins are counted per account name and per client address (`login_failures`). Past
  `ACCOUNT_FREE` (resp. `ADDRESS_FREE`) failures in a row the key is locked for 1 s, doubling with
  each further failure up to `MAX_LOCK_S`. An attempt while locked is refused without checking the
  password (so a right password is refused too) and counts as a failure; a success clears the
  account's count. A streak older than `FORGET_AFTER` starts again from zero.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from datetime import datetime, timedelta

from sqlalchemy import DateTime, ForeignKey, Integer, String, delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Mapped, Session, mapped_column

from data.models import Base, as_utc, utcnow

ACCOUNT_FREE = 5  # failed sign-ins in a row before an account is locked
ADDRESS_FREE = 20  # the same for one client address, across accounts
MAX_LOCK_S = 900
FORGET_AFTER = timedelta(hours=1)  # longer than MAX_LOCK_S: a forgotten streak's lock is over


class UserSession(Base):
    """One sign-in: its cookie's secret (hashed) and when it expires."""

    __tablename__ = "user_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LoginFailure(Base):
    """Failed sign-ins in a row for one key (`name:<account>` or `address:<client>`)."""

    __tablename__ = "login_failures"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    last_failure_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SignInLocked(Exception):
    """Too many failed sign-ins: `retry_after_s` says when to try again; the message says why."""

    def __init__(self, what: str, retry_after_s: int) -> None:
        super().__init__(f"too many failed sign-ins {what}; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


# ---- sessions ----------------------------------------------------------------------------------------


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def start_session(session: Session, user_id: int, max_age_s: int) -> str:
    """A new session row for the user (flushed; the caller commits); returns the cookie's secret.
    The user's expired sessions go at the same time."""
    secret = secrets.token_urlsafe(32)
    expired = delete(UserSession).where(UserSession.user_id == user_id, UserSession.expires_at <= utcnow())
    session.execute(expired)
    session.add(UserSession(user_id=user_id, secret_sha256=_sha256(secret),
                            expires_at=utcnow() + timedelta(seconds=max_age_s)))
    session.flush()
    return secret


def live_session(session: Session, user_id: int, secret: str) -> UserSession | None:
    """The user's session that `secret` names, if it has not ended or expired."""
    row = session.scalar(select(UserSession).where(UserSession.secret_sha256 == _sha256(secret)))
    if row is None or row.user_id != user_id or as_utc(row.expires_at) <= utcnow():
        return None
    return row


def end_session(session: Session, secret: str) -> None:
    """End the session `secret` names (signing out); nothing when it has ended already."""
    session.execute(delete(UserSession).where(UserSession.secret_sha256 == _sha256(secret)))


def end_other_sessions(session: Session, user_id: int, keep_secret: str | None = None) -> int:
    """End every session of the user but the one `keep_secret` names; returns how many ended."""
    query = delete(UserSession).where(UserSession.user_id == user_id)
    if keep_secret is not None:
        query = query.where(UserSession.secret_sha256 != _sha256(keep_secret))
    return session.execute(query).rowcount or 0


# ---- the limit on failed sign-ins ----------------------------------------------------------------------


def limit_keys(name: str, address: str | None) -> list[tuple[str, int, str]]:
    """(key, failures allowed before a lock, how a refusal names it) for an attempt."""
    keys = [(f"name:{name.lower()[:150]}", ACCOUNT_FREE, "for this account")]
    if address:
        keys.append((f"address:{address[:150]}", ADDRESS_FREE, "from this address"))
    return keys


def lock_seconds(failures: int, free: int) -> int:
    """How long a key is locked after `failures` in a row: 0 up to `free`, then 1, 2, 4… ≤ MAX_LOCK_S."""
    if failures < free:
        return 0
    return min(MAX_LOCK_S, 2 ** min(failures - free, 20))


def check_sign_in_allowed(session: Session, name: str, address: str | None) -> None:
    """Raise `SignInLocked` (after counting this attempt as a failure) while a key is locked."""
    for key, _free, what in limit_keys(name, address):
        if _locked_for(session, key) > 0:
            note_failure(session, name, address)
            raise SignInLocked(what, max(1, math.ceil(_locked_for(session, key))))


def _locked_for(session: Session, key: str) -> float:
    """Seconds the key stays locked (0 when it is not)."""
    row = session.get(LoginFailure, key, populate_existing=True)
    until = as_utc(row.locked_until) if row is not None else None
    return max(0.0, (until - utcnow()).total_seconds()) if until is not None else 0.0


def note_failure(session: Session, name: str, address: str | None) -> None:
    """Count a failed sign-in for the account and the address (flushed; the caller commits)."""
    now = utcnow()
    _forget_old(session, now)
    for key, free, _what in limit_keys(name, address):
        _ensure_row(session, key)
        row = session.get(LoginFailure, key, with_for_update=True, populate_existing=True)
        assert row is not None
        last = as_utc(row.last_failure_at)
        failures = 1 if last is None or now - last > FORGET_AFTER else row.failures + 1
        row.failures, row.last_failure_at = failures, now
        seconds = lock_seconds(failures, free)
        row.locked_until = now + timedelta(seconds=seconds) if seconds else None
    session.flush()


def note_success(session: Session, name: str) -> None:
    """A right password: the account's streak ends (the address's decays with time)."""
    key = limit_keys(name, None)[0][0]
    session.execute(delete(LoginFailure).where(LoginFailure.key == key))


def _ensure_row(session: Session, key: str) -> None:
    """The key's row exists (inserted by whichever request comes first; no race on the insert)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    values = {"key": key, "failures": 0, "last_failure_at": utcnow()}
    session.execute(insert(LoginFailure).values(**values).on_conflict_do_nothing(index_elements=["key"]))


def _forget_old(session: Session, now: datetime) -> None:
    """Drop streaks nobody has added to for `FORGET_AFTER` and whose lock is over (the table stays small)."""
    session.execute(delete(LoginFailure).where(LoginFailure.last_failure_at < now - FORGET_AFTER))


__all__ = [
    "ACCOUNT_FREE", "ADDRESS_FREE", "MAX_LOCK_S", "LoginFailure", "SignInLocked", "UserSession",
    "check_sign_in_allowed", "end_other_sessions", "end_session", "limit_keys",
    "live_session", "lock_seconds", "note_failure", "note_success", "start_session",
]
