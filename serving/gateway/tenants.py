"""Whose bases a request may use: its tenant. A base serves only the tenant that made it, so no
request is ever sent upstream with another tenant's text (an erratum quotes the base's old value).

- Under `kvnotes serve` the tenant is the signed-in user (a session or an API token of that user).
- Standalone (`kvnotes gateway`), the tenant is the header the operator names (`--tenant-header`,
  set by their proxy; a request without it has no tenant), else the API key (`Authorization:
  Bearer KEY`), kept only as a hash.
- A request with no key, or with a key the operator declares shared (`--shared-key`, and the
  placeholders that client examples use: `SHARED_KEYS`), has no tenant: it is passed through,
  saying why, unless the operator opts in (`--rewrite-shared`), when all such requests are one
  tenant, "shared" (for a deployment where every client may read every other's prompts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# keys that client examples and docs use as placeholders: many unrelated clients send them
# (`api_key="unused"` in docs/gateway.md, "EMPTY" in vLLM's, "sk-no-key-required" in llama.cpp's …)
SHARED_KEYS = frozenset({"", "unused", "empty", "none", "null", "dummy", "placeholder", "not-needed",
                         "no-key", "sk-no-key-required", "sk-dummy", "sk-xxx", "x", "-", "key", "token",
                         "api-key", "your-api-key", "changeme"})
SHARED = "shared"  # the tenant of keyless and shared-key requests under --rewrite-shared


@dataclass(frozen=True)
class Tenant:
    """`id`: the tenant's name in the state ("" for none); `kind`: how it was told (user, header,
    key, shared, none); `why_not`: why the request has none (its pass-through reason)."""

    id: str
    kind: str
    why_not: str = ""

    @property
    def header(self) -> str:
        """The `x-kvnotes-tenant` header's value: the kind, never the id."""
        return self.kind


@dataclass(frozen=True)
class TenantRules:
    """The operator's rules: the tenant header, the keys declared shared, the opt-in."""

    header: str = ""
    shared_keys: frozenset[str] = frozenset()
    rewrite_shared: bool = False

    @classmethod
    def of(cls, header: str = "", shared_keys: Iterable[str] = (),
           rewrite_shared: bool = False) -> TenantRules:
        return cls(header.strip().lower(), frozenset(k.strip() for k in shared_keys if k.strip()),
                   rewrite_shared)

    def identify(self, user: str | None, headers: Mapping[str, str]) -> Tenant:
        """The tenant of a request from `user` (the signed-in user's name, or None) with `headers`
        (a case-insensitive mapping, as Starlette's)."""
        if user:
            return Tenant("user:" + _digest(user), "user")
        if self.header:
            value = headers.get(self.header, "").strip()
            if value:
                return Tenant("header:" + _digest(value), "header")
            return self._none(f"no {self.header} header")
        key = _bearer(headers.get("authorization", ""))
        if not key:
            return self._none("no API key")
        if key.lower() in SHARED_KEYS or key in self.shared_keys:
            return self._none("a shared API key")
        return Tenant("key:" + _digest(key), "key")

    def _none(self, why: str) -> Tenant:
        if self.rewrite_shared:
            return Tenant(SHARED, SHARED)
        return Tenant("", "none", f"no tenant: {why} (the operator may opt in with --rewrite-shared)")


def _bearer(value: str) -> str:
    scheme, _, rest = value.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" else value.strip()


def _digest(value: str) -> str:
    """A tenant's id: a hash (a key is never stored nor logged)."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:24]
