"""What the gateway derives from its secret (`KVNOTES_SECRET_KEY`, else the data folder's key file:
`data.signing.secret_key`, as `serve`'s sessions): each tenant's cache salt, and the key that seals
the prompts it keeps in Redis.

- `GatewaySecret.salt(tenant_id)`: HMAC-SHA256 of the tenant's id under a key derived for salts,
  64 hex digits (vLLM takes at most 128 characters, none of `@ / \\` or NUL). The same for every
  request of a tenant, different between tenants, and neither the tenant's key nor its name: a
  client cannot compute another tenant's salt without the secret.
- `Sealer`: AES-256-GCM (`cryptography`), a key derived by HKDF-SHA256 from the secret, a random
  96-bit nonce per value, the value's name (its Redis key and field) as associated data, so a sealed
  value moved to another name does not open. A sealed value is "v1." and the URL-safe base64 of
  nonce + ciphertext + tag. `open` raises `Unsealable` for a value sealed under another secret (a
  replica given another `KVNOTES_SECRET_KEY`) or altered.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = "v1."
NONCE_BYTES = 12


class Unsealable(ValueError):
    """A sealed value that does not open under this secret (another secret, or altered)."""


def _derive(secret: str, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"kvnotes-gateway", info=purpose).derive(
        secret.encode("utf-8", "surrogatepass"))


class Sealer:
    """AES-GCM under a key of its own (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, text: str, name: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode("utf-8", "surrogatepass"), name.encode())
        return VERSION + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def open(self, value: str, name: str) -> str:
        if not value.startswith(VERSION):
            raise Unsealable(f"{name} is not sealed")
        try:
            raw = base64.urlsafe_b64decode(value[len(VERSION):])
            return self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], name.encode()).decode(
                "utf-8", "surrogatepass")
        except (InvalidTag, ValueError) as exc:
            raise Unsealable(f"{name} does not open under this gateway's secret "
                             f"({type(exc).__name__})") from None


class GatewaySecret:
    """The secret's two uses: `salt(tenant_id)` and `sealer`."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the gateway's secret is empty")
        self._salt_key = _derive(secret, b"cache salt")
        self.sealer = Sealer(_derive(secret, b"sealed texts"))

    def salt(self, tenant_id: str) -> str:
        message = tenant_id.encode("utf-8", "surrogatepass")
        return hmac.new(self._salt_key, message, hashlib.sha256).hexdigest()
