"""The secret key and what it signs: session cookies, CSRF tokens and read-only share links.

The key is `KVNOTES_SECRET_KEY`. The embedded default on 127.0.0.1 needs no setup, so without one a
random key is made once and kept in `<data>/secret_key` (mode 0600); `kvnotes serve` on any other
address refuses to start without `KVNOTES_SECRET_KEY` (several web processes must share one key).
The key is settled when the app starts (`ensure_secret_key`, called by `app.main.create_app`),
never on first use: a key file that cannot be made (a read-only data folder) stops the start with
one line naming the fix, and a configured key that is short or guessable (one short pattern
repeated, a run such as "abcd…", under `MIN_KEY_BITS` of character entropy) is refused the same way.
Signing uses itsdangerous (HMAC-SHA1 over a key derived per purpose with its salt).
"""

from __future__ import annotations

import math
import os
import secrets
from collections import Counter
from functools import lru_cache
from pathlib import Path

from itsdangerous import BadSignature, URLSafeSerializer, URLSafeTimedSerializer

from data.settings import get_settings

KEY_FILE = "secret_key"
MIN_KEY_CHARS = 32
MIN_KEY_BITS = 80  # Shannon entropy of the key's characters times its length; 32 random hex digits give ~90+
MAKE_ONE = "e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`"


class SecretKeyProblem(RuntimeError):
    """The secret key cannot be used or made; the message names the fix in one line."""


def key_problem(key: str) -> str | None:
    """Why `key` is not a usable secret key (one line), or None."""
    if len(key) < MIN_KEY_CHARS:
        return (f"KVNOTES_SECRET_KEY has {len(key)} characters: it needs at least {MIN_KEY_CHARS} "
                f"random ones ({MAKE_ONE})")
    steps = Counter(ord(b) - ord(a) for a, b in zip(key, key[1:], strict=False))
    period = next(p for p in range(1, len(key) + 1) if key == (key[:p] * len(key))[: len(key)])
    counts = Counter(key)
    bits = -sum(n * math.log2(n / len(key)) for n in counts.values())
    runs = steps.most_common(1)[0][1] >= 0.75 * (len(key) - 1)  # "abcd…", "1234…"
    if period <= len(key) // 2 or runs or bits < MIN_KEY_BITS:
        return ("KVNOTES_SECRET_KEY is guessable (a short pattern repeated, a run, or few distinct "
                "characters): "
                f"use {MIN_KEY_CHARS}+ random characters ({MAKE_ONE})")
    return None


def key_file() -> Path:
    return get_settings().data_dir / KEY_FILE


def _read_or_make_key_file(path: Path) -> str:
    """The key kept in `path` (its mode made 0600), made (random, 0600) when it does not exist yet."""
    try:
        key = path.read_text(encoding="utf-8").strip()
        if len(key) >= MIN_KEY_CHARS:
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(48)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return key


@lru_cache(maxsize=4)
def _key(configured: str, data_dir: str) -> str:
    if configured:
        problem = key_problem(configured)
        if problem:
            raise SecretKeyProblem(problem)
        return configured
    path = Path(data_dir) / KEY_FILE
    try:
        return _read_or_make_key_file(path)
    except OSError as exc:
        raise SecretKeyProblem(
            f"KVNOTES_SECRET_KEY is not set and the key file {path} cannot be made ({exc.strerror or exc}): "
            f"set KVNOTES_SECRET_KEY ({MAKE_ONE}) or make the data folder writable") from None


def secret_key() -> str:
    """`KVNOTES_SECRET_KEY`, else the data folder's key file. Raises `SecretKeyProblem`."""
    settings = get_settings()
    return _key(settings.secret_key, str(settings.data_dir))


def ensure_secret_key() -> None:
    """Settle the key now (at start-up), so no request is the first to need it. Raises `SecretKeyProblem`."""
    secret_key()


def timed_serializer(salt: str) -> URLSafeTimedSerializer:
    """Signs values that expire (session cookies): `loads(token, max_age=...)`."""
    return URLSafeTimedSerializer(secret_key(), salt=salt)


def serializer(salt: str) -> URLSafeSerializer:
    """Signs values that live until revoked in the database (share links)."""
    return URLSafeSerializer(secret_key(), salt=salt)


__all__ = ["BadSignature", "MIN_KEY_CHARS", "SecretKeyProblem", "ensure_secret_key", "key_file",
           "key_problem", "secret_key", "serializer", "timed_serializer"]
