"""Accounts: users (argon2-hashed passwords, role `editor` or `viewer`), their API tokens and the
read-only share links of runs. The command line (`kvnotes users|tokens`) and the web app both use
these functions; neither hashes or compares a secret anywhere else.

- Passwords: argon2id (argon2-cffi's `PasswordHasher`, its default parameters: 64 MiB each),
  rehashed on sign-in when those parameters change. At most `HASH_SLOTS` hashes run at once and at
  most `HASH_WAITERS` more wait for a slot; beyond that `HashingBusy` answers at once (503), so a
  crowd of sign-ins can neither fill the memory nor hold every request thread.
  Changing a password ends the user's other sessions (`data.sign_in`).
- API tokens: `kvn_` + 43 random URL-safe characters. Only the SHA-256 of a token is stored (a
  high-entropy token needs no slow hash), so a leaked database holds no usable token.
- Share links: a row per link (revocable) whose id and random nonce are signed with the secret key
  (`data.signing`); the link shows one run and its report, read-only, without an account.

The tables share `data.models.Base` (so `Base.metadata` knows them once this module is imported;
migrations/env.py and the app import it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import CheckConstraint, DateTime, ForeignKey, String, func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship

from data.models import Base, as_utc, utcnow
from data.sign_in import end_other_sessions, note_success
from data.signing import BadSignature, serializer
from vocabulary import text_rules

ROLES = ("editor", "viewer")
LOCAL_USER = "local"  # who made things on the embedded default, where nobody signs in
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024
TOKEN_PREFIX = "kvn_"
TOKEN_USE_RESOLUTION = timedelta(hours=1)  # how finely `last_used_at` follows a token's use

# argon2 hashes at once, and sign-ins that may wait for one (more are refused at once): together
# well under the requests a web process serves at once (KVNOTES_DB_POOL_SIZE, 8 by default), so a
# crowd of sign-ins, each holding its request's place for ~0.6 s of hashing, never fills them all
HASH_SLOTS = 2
HASH_WAITERS = 2

_hasher = PasswordHasher()
_DUMMY_HASH = _hasher.hash("kvnotes: compare against something when the user does not exist")
_admitted = threading.BoundedSemaphore(HASH_SLOTS + HASH_WAITERS)
_hashing = threading.BoundedSemaphore(HASH_SLOTS)


class AccountError(ValueError):
    """A request the accounts cannot honour; the message names the field and the rule."""


class HashingBusy(RuntimeError):
    """Too many sign-ins at once: every password-hash slot and waiting place is taken."""

    retry_after_s = 1

    def __init__(self) -> None:
        super().__init__("too many sign-ins at once; try again in a second")


@contextmanager
def hash_slot() -> Iterator[None]:
    """Hold one of the `HASH_SLOTS` (waiting, if one of the `HASH_WAITERS` places is free)."""
    if not _admitted.acquire(blocking=False):
        raise HashingBusy
    try:
        with _hashing:
            yield
    finally:
        _admitted.release()


def hash_password(password: str) -> str:
    with hash_slot():
        return _hasher.hash(password)


class User(Base):
    __tablename__ = "users"
    __table_args__ = (CheckConstraint("role IN ('editor', 'viewer')", name="role"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16), default="editor")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(
        back_populates="user", cascade="all, delete-orphan", passive_deletes=True, order_by="ApiToken.id"
    )


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))  # the first characters, to tell tokens apart in lists
    label: Mapped[str] = mapped_column(String(100), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    user: Mapped[User] = relationship(back_populates="tokens")


class ShareLink(Base):
    """A revocable, signed, read-only link to one run."""

    __tablename__ = "share_links"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    nonce: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# ---- passwords and users ---------------------------------------------------------------------------


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name or ""):
        raise AccountError("name: 1-64 characters of letters, digits and _ . @ -, "
                           "starting with a letter or digit")
    if name == LOCAL_USER:
        raise AccountError(f"name: {LOCAL_USER!r} is reserved for the embedded default's single user")
    return name


def check_password(password: str) -> str:
    """The password rules, the one place the web form and `kvnotes users add/passwd` meet: 8 to 1024
    characters (`MIN_PASSWORD_CHARS`, `MAX_PASSWORD_CHARS`), valid Unicode, no control character (NUL
    included: no typed password holds one), not blank (spaces or zero-width characters only:
    `vocabulary.text_rules.visible`) and no U+FFFD (a password read with the wrong encoding, which its
    owner could never type again)."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise AccountError(f"password: {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters")
    problem = text_rules.text_problem(password)
    control = next((ch for ch in password if unicodedata.category(ch) == "Cc"), None)
    if problem is None and control is not None:
        problem = f"cannot contain a control character (U+{ord(control):04X})"
    if problem is None and text_rules.PLACEHOLDER in password:
        problem = "cannot contain U+FFFD (the replacement character of text read with the wrong encoding)"
    if problem is not None:
        raise AccountError(f"password: {problem}")
    return password


def add_user(session: Session, name: str, password: str, role: str = "editor") -> User:
    """A new user (flushed; the caller commits)."""
    check_name(name)
    check_password(password)
    if role not in ROLES:
        raise AccountError(f"role: one of {', '.join(ROLES)}; got {role!r}")
    if find_user(session, name) is not None:
        raise AccountError(f"name: a user named {name!r} exists already")
    user = User(name=name, password_hash=hash_password(password), role=role)
    session.add(user)
    session.flush()
    return user


def find_user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.name)))


def remove_user(session: Session, name: str) -> None:
    """Delete the user and their tokens; what they made keeps their name."""
    user = find_user(session, name)
    if user is None:
        raise AccountError(f"name: no user named {name!r}")
    session.delete(user)


def set_password(session: Session, name: str, password: str, keep_session: str | None = None) -> int:
    """Give user `name` a new password, end their sessions but `keep_session` (the secret of the
    session that changed it, if any) and clear their account's failed sign-ins; returns how many
    sessions ended. The caller commits."""
    user = find_user(session, name)
    if user is None:
        raise AccountError(f"name: no user named {name!r}")
    check_password(password)
    user.password_hash = hash_password(password)
    session.flush()
    note_success(session, name)  # a lock from guesses at the old password ends with it
    return end_other_sessions(session, user.id, keep_session)


def count_users(session: Session) -> int:
    return session.scalar(select(func.count(User.id))) or 0


def authenticate(session: Session, name: str, password: str) -> User | None:
    """The user if `password` is theirs; None otherwise (the same work either way, so the answer's
    time does not tell whether the name exists)."""
    user = find_user(session, name) if NAME_PATTERN.match(name or "") else None
    try:
        with hash_slot():
            _hasher.verify(user.password_hash if user else _DUMMY_HASH, password[:MAX_PASSWORD_CHARS])
    except (VerificationError, InvalidHashError):
        return None
    if user is None:
        return None
    if _hasher.check_needs_rehash(user.password_hash):
        user.password_hash = hash_password(password)
    return user


# ---- API tokens ------------------------------------------------------------------------------------


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(session: Session, name: str, label: str = "") -> tuple[ApiToken, str]:
    """A new token for user `name`: (its row, the token itself, shown once and never stored)."""
    user = find_user(session, name)
    if user is None:
        raise AccountError(f"name: no user named {name!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(user=user, token_sha256=_sha256(token), hint=token[: len(TOKEN_PREFIX) + 6],
                   label=label[:100])
    session.add(row)
    session.flush()
    return row, token


def list_tokens(session: Session, name: str | None = None) -> list[ApiToken]:
    query = select(ApiToken).join(User).order_by(ApiToken.id)
    if name is not None:
        query = query.where(User.name == name)
    return list(session.scalars(query))


def revoke_token(session: Session, which: str) -> int:
    """Revoke by token id, by the token itself, or every token of a user (`which` = their name);
    returns how many were revoked (0 raises)."""
    if which.isdigit():
        rows = [row] if (row := session.get(ApiToken, int(which))) is not None else []
    elif which.startswith(TOKEN_PREFIX):
        rows = list(session.scalars(select(ApiToken).where(ApiToken.token_sha256 == _sha256(which))))
    else:
        rows = list_tokens(session, which)
    if not rows:
        raise AccountError(f"token: nothing matches {which[:12]!r} "
                           "(give a token id, the token, or a user name)")
    for row in rows:
        session.delete(row)
    return len(rows)


def user_for_token(session: Session, token: str) -> User | None:
    """The user a Bearer token belongs to, or None. Notes the token's use at most once an hour
    (best effort: a database that cannot be written must not refuse the token)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == _sha256(token)))
    if row is None or not hmac.compare_digest(row.token_sha256, _sha256(token)):
        return None
    user = row.user
    last = as_utc(row.last_used_at)
    if last is None or utcnow() - last > TOKEN_USE_RESOLUTION:
        try:  # its own short transaction: the request's session is left as it was
            with session.get_bind().begin() as connection:
                used = update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=utcnow())
                connection.execute(used)
        except SQLAlchemyError:
            pass  # a database that cannot be written: the request goes on
    return user


# ---- share links -------------------------------------------------------------------------------------

_SHARE_SALT = "kvnotes.share"


def create_share(session: Session, run_id: int, created_by: str | None) -> tuple[ShareLink, str]:
    """A new share link for run `run_id`: (its row, the signed token that goes in `/share/<token>`)."""
    link = ShareLink(run_id=run_id, nonce=secrets.token_hex(16), created_by=created_by)
    session.add(link)
    session.flush()
    return link, share_token(link)


def share_token(link: ShareLink) -> str:
    return serializer(_SHARE_SALT).dumps([link.id, link.nonce])


def resolve_share(session: Session, token: str) -> ShareLink | None:
    """The live link a token names: signature valid, row present, nonce equal, not revoked."""
    try:
        ident, nonce = serializer(_SHARE_SALT).loads(token[:500])
    except (BadSignature, ValueError, TypeError):
        return None
    if not isinstance(ident, int) or not isinstance(nonce, str) or not 0 < ident < 2**63:
        return None
    link = session.get(ShareLink, ident)
    if link is None or link.revoked_at is not None or not hmac.compare_digest(link.nonce, nonce):
        return None
    return link


def revoke_share(session: Session, link: ShareLink) -> None:
    if link.revoked_at is None:
        link.revoked_at = utcnow()


def list_shares(session: Session, run_id: int) -> list[ShareLink]:
    return list(session.scalars(select(ShareLink).where(ShareLink.run_id == run_id).order_by(ShareLink.id)))


__all__ = [
    "ROLES", "LOCAL_USER", "AccountError", "User", "ApiToken", "ShareLink", "add_user", "find_user",
    "list_users", "remove_user", "set_password", "count_users", "authenticate", "HashingBusy",
    "hash_slot", "hash_password", "create_token", "list_tokens",
    "revoke_token", "user_for_token", "create_share", "share_token", "resolve_share", "revoke_share",
    "list_shares",
]
