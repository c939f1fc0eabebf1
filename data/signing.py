"""The secret key and what it signs: session cookies, CSRF tokens and read-only share links.

The key is `KVNOTES_SECRET_KEY`. The embedded default on 127.0.0.1 needs no setup, so without one a
random key is made once and kept in `<data>/secret_key` (mode 0600); `kvnotes serve` on any other
address refuses to start without `KVNOTES_SECRET_KEY` (several web processes must share one key).
Signing uses itsdangerous (HMAC-SHA1 over a key derived per purpose with its salt).
"""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path

from itsdangerous import BadSignature, URLSafeSerializer, URLSafeTimedSerializer

from data.settings import get_settings

KEY_FILE = "secret_key"
MIN_KEY_CHARS = 32


def key_file() -> Path:
    return get_settings().data_dir / KEY_FILE


def _read_or_make_key_file(path: Path) -> str:
    """The key kept in `path`, made (random, 0600) when it does not exist yet."""
    try:
        key = path.read_text(encoding="utf-8").strip()
        if len(key) >= MIN_KEY_CHARS:
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
    return configured or _read_or_make_key_file(Path(data_dir) / KEY_FILE)


def secret_key() -> str:
    """`KVNOTES_SECRET_KEY`, else the data folder's key file."""
    settings = get_settings()
    return _key(settings.secret_key, str(settings.data_dir))


def timed_serializer(salt: str) -> URLSafeTimedSerializer:
    """Signs values that expire (session cookies): `loads(token, max_age=...)`."""
    return URLSafeTimedSerializer(secret_key(), salt=salt)


def serializer(salt: str) -> URLSafeSerializer:
    """Signs values that live until revoked in the database (share links)."""
    return URLSafeSerializer(secret_key(), salt=salt)


__all__ = ["BadSignature", "secret_key", "serializer", "timed_serializer", "key_file", "MIN_KEY_CHARS"]
