"""Signing in on a shared server: sessions that end, and a limit on failed sign-ins.

- Sessions: one `user_sessions` row per sign-in. The cookie carries a random secret; only its
  SHA-256 is stored. A request's session is live while its row exists and has not expired, so
  signing out (`end_session`) or changing the password (`end_other_sessions`) ends it on the
  server: a cookie saved before is refused from then on.
- Failed sign-ins are counted per account and client address together, per address, and per
  account (`login_failures`), so that a stranger cannot lock the owner out:
  - an account from one address (`PAIR_FREE` failures in a row), and an address across accounts
    (`ADDRESS_FREE`), are then locked for 1 s, doubling with each further failure up to
    `MAX_LOCK_S`; an attempt while locked is refused without checking the password (a right one
    too) and counts as a failure, so only the guesser's own lock grows;
  - the account from everywhere (`ACCOUNT_FREE`) gets a delay instead: 1 s, doubling, at most
    `MAX_ACCOUNT_DELAY_S`; an attempt within it is refused (Retry-After) but not counted, so
    guessing from many addresses slows to one try per delay while the owner waits seconds at most.
  A success clears the account's count and its address's count for it. A streak older than
  `FORGET_AFTER` starts again from zero.
- The client address is the connection's, or the `X-Forwarded-For` of a proxy the operator named
  (`KVNOTES_TRUSTED_PROXIES`; `kvnotes serve` tells uvicorn); by default no proxy is trusted.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import DateTime, ForeignKey, Integer, String, delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Mapped, Session, mapped_column

from data.models import Base, as_utc, utcnow

PAIR_FREE = 5  # failed sign-ins in a row for one account from one address before they are locked
ADDRESS_FREE = 20  # the same for one client address, across accounts
ACCOUNT_FREE = 10  # the same for one account from every address, before its delay starts
MAX_LOCK_S = 900
MAX_ACCOUNT_DELAY_S = 30
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


@dataclass(frozen=True)
class Limit:
    """One key's limit: failures allowed before it locks, the longest lock, how a refusal names it,
    and whether an attempt refused by it counts as a failure."""

    key: str
    free: int
    max_s: int
    what: str
    counts_refused: bool = True


def limit_keys(name: str, address: str | None) -> list[Limit]:
    """The limits an attempt on `name` from `address` is held to."""
    account = name.lower()[:100]
    keys = [Limit(f"pair:{account}|{(address or '-')[:90]}", PAIR_FREE, MAX_LOCK_S,
                  "for this account from this address"),
            Limit(f"name:{account}", ACCOUNT_FREE, MAX_ACCOUNT_DELAY_S, "for this account", False)]
    if address:
        keys.append(Limit(f"address:{address[:150]}", ADDRESS_FREE, MAX_LOCK_S, "from this address"))
    return keys


def lock_seconds(failures: int, free: int, max_s: int = MAX_LOCK_S) -> int:
    """How long a key is locked after `failures` in a row: 0 up to `free`, then 1, 2, 4… ≤ max_s."""
    if failures < free:
        return 0
    return min(max_s, 2 ** min(failures - free, 20))


def check_sign_in_allowed(session: Session, name: str, address: str | None) -> None:
    """Raise `SignInLocked` while a key is locked (after counting this attempt as a failure,
    unless only the account's delay refused it)."""
    for limit in limit_keys(name, address):
        if _locked_for(session, limit.key) > 0:
            if limit.counts_refused:
                note_failure(session, name, address)
            raise SignInLocked(limit.what, max(1, math.ceil(_locked_for(session, limit.key))))


def _locked_for(session: Session, key: str) -> float:
    """Seconds the key stays locked (0 when it is not)."""
    row = session.get(LoginFailure, key, populate_existing=True)
    until = as_utc(row.locked_until) if row is not None else None
    return max(0.0, (until - utcnow()).total_seconds()) if until is not None else 0.0


def note_failure(session: Session, name: str, address: str | None) -> None:
    """Count a failed sign-in for the account and the address (flushed; the caller commits)."""
    now = utcnow()
    _forget_old(session, now)
    for limit in limit_keys(name, address):
        _ensure_row(session, limit.key)
        row = session.get(LoginFailure, limit.key, with_for_update=True, populate_existing=True)
        assert row is not None
        last = as_utc(row.last_failure_at)
        failures = 1 if last is None or now - last > FORGET_AFTER else row.failures + 1
        row.failures, row.last_failure_at = failures, now
        seconds = lock_seconds(failures, limit.free, limit.max_s)
        row.locked_until = now + timedelta(seconds=seconds) if seconds else None
    session.flush()


def note_success(session: Session, name: str, address: str | None = None) -> None:
    """A right password: the account's streak ends, and its streak from this address (the
    address's own decays with time; another address's streak for the account stays)."""
    keys = [limit.key for limit in limit_keys(name, address) if not limit.key.startswith("address:")]
    session.execute(delete(LoginFailure).where(LoginFailure.key.in_(keys)))


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
    "ACCOUNT_FREE", "ADDRESS_FREE", "MAX_ACCOUNT_DELAY_S", "MAX_LOCK_S", "PAIR_FREE", "Limit", "LoginFailure",
    "SignInLocked", "UserSession",
    "check_sign_in_allowed", "end_other_sessions", "end_session", "limit_keys",
    "live_session", "lock_seconds", "note_failure", "note_success", "start_session",
]
