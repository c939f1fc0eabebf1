"""Whose bases a request may use: its tenant. A base serves only the tenant that made it, so no
request is ever sent upstream with another tenant's text (an erratum quotes the base's old value),
and every request goes upstream with its tenant's cache salt (`serving.gateway.sealing`).

- Under `kvnotes serve` the tenant is the signed-in user (a session or an API token of that user).
- Standalone (`kvnotes gateway`), a tenant is proven, never taken on a client's word:
  - `--keys FILE` (`KeyFile`): one line per key, `TENANT sha256:HEX`, the SHA-256 of the key; a
    request whose bearer key is not listed is refused (401) before anything goes upstream. No key
    string is special: a placeholder such as `EMPTY` is an unlisted key like any other. The file is
    read again whenever it changes (a key is revoked by deleting its line, without a restart).
  - `--tenant-header NAME` with `--trusted-proxies`: the header names the tenant only on a request
    from one of those addresses or networks; the header from any other address is refused (403),
    and so, without `--keys`, is any request from another address. A header sent twice, or whose
    value holds a comma (a proxy that appends to the client's own instead of replacing it), is
    refused (400): the proxy must set it, once.
  - With both, every request needs a listed key, and the trusted proxy's header, when it sends one,
    names the tenant.
  - With neither (only on loopback: `kvnotes gateway` refuses to start elsewhere), one user's tool:
    the tenant is the API key as the client sent it (kept only as a hash), and a request without a
    key has no tenant and is passed through, unless the operator opts in (`--rewrite-shared`),
    when all of them are one tenant, "shared".
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("kvnotes.gateway")
SHARED = "shared"  # the tenant of keyless requests under --rewrite-shared
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
_LINE = re.compile(r"(\S+)\s+sha256:([0-9a-fA-F]{64})")
KEY_PREFIX = "kvn-"  # the keys `kvnotes gateway keys add` makes: "kvn-" and 43 random URL-safe characters

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refused(Exception):
    """A request refused before anything goes upstream: `status` (401, 403, 400, 503) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KeysProblem(ValueError):
    """The key file cannot be used; the message names the line or the fault."""


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


def parse_keys(text: str) -> dict[str, str]:
    """{the SHA-256 of a key (hex): its tenant} from a key file's text; `KeysProblem` naming the first
    line that is not `TENANT sha256:HEX` (blank lines and `#` comments are skipped)."""
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise KeysProblem(f"line {number} is not 'TENANT sha256:HEX' (64 hex digits)")
        name, digest = match.group(1), match.group(2).lower()
        if not TENANT_NAME.fullmatch(name):
            raise KeysProblem(f"line {number}: the tenant {name[:70]!r} must be 1-64 letters, digits "
                              "or ._@+- (starting with a letter or digit)")
        if keys.get(digest, name) != name:
            raise KeysProblem(f"line {number}: that key is listed for two tenants ({keys[digest]}, {name})")
        keys[digest] = name
    return keys


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyFile:
    """The operator's key file (`parse_keys`), read again whenever its size, time or inode changes
    (one `stat` per request). A file that is gone or no longer parses refuses every request (503,
    naming the fault) until it is fixed: a revocation never silently fails open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._keys: dict[str, str] = {}
        self._problem = ""
        self.check()

    def check(self) -> str:
        """Read the file again when it changed; the problem with it ("" when none)."""
        try:
            st = os.stat(self.path)
            seen: tuple = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        except OSError as exc:
            seen = ("missing", exc.strerror)
        with self._lock:
            if seen == self._seen:
                return self._problem
            try:
                self._keys = parse_keys(self.path.read_text(encoding="utf-8"))
                self._problem = ""
            except (OSError, UnicodeDecodeError, KeysProblem) as exc:
                self._keys = {}
                self._problem = f"the key file {self.path} {_why(exc)}"
                log.error("gateway key file unusable: every request is refused",
                          extra={"error": self._problem})
            self._seen = seen
            return self._problem

    def tenant_of(self, key: str) -> str | None:
        """The tenant `key` is listed for, None when it is not (`Refused` 503 when the file is unusable)."""
        problem = self.check()
        if problem:
            raise Refused(503, f"{problem}: every request is refused until it is fixed")
        return self._keys.get(key_hash(key))

    def __len__(self) -> int:
        self.check()
        return len(self._keys)


def _why(exc: Exception) -> str:
    if isinstance(exc, KeysProblem):
        return f"is not valid: {exc}"
    if isinstance(exc, UnicodeDecodeError):
        return "is not UTF-8 text"
    return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"


def add_key(path: str | Path, tenant: str) -> str:
    """Make a random key for `tenant`, append its hash to the key file at `path` (made 0600 when it
    does not exist; replaced whole, so a gateway reading it never sees half a line) and return the
    key, which is kept nowhere else. `KeysProblem` for a bad name or a file that does not parse."""
    if not TENANT_NAME.fullmatch(tenant):
        raise KeysProblem(f"the tenant {tenant[:70]!r} must be 1-64 letters, digits or ._@+- "
                          "(starting with a letter or digit)")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysProblem(f"{path} {_why(exc)}") from None
    parse_keys(text)  # refuse to add to a file the gateway could not read
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    text = (text if not text or text.endswith("\n") else text + "\n") + f"{tenant} sha256:{key_hash(key)}\n"
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return key


def trusted_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """The networks of `KVNOTES_TRUSTED_PROXIES`'s entries (addresses or networks, as `serve` reads
    them: `data.settings.Settings.trusted_proxies`); `ValueError` naming an entry that is neither."""
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value.strip()[:80]!r} is not an address or a network "
                             "(e.g. 10.0.0.5 or 10.0.0.0/24)") from None
    return tuple(found)


@dataclass(frozen=True)
class TenantRules:
    """The operator's rules: the key file, the tenant header and the proxies trusted to set it, the
    opt-in for keyless requests."""

    header: str = ""
    trusted: tuple[Network, ...] = ()
    keys: KeyFile | None = field(default=None, compare=False)
    rewrite_shared: bool = False

    @classmethod
    def of(cls, header: str = "", trusted: Iterable[str] = (), keys: str | Path = "",
           rewrite_shared: bool = False) -> TenantRules:
        return cls(header.strip().lower(), trusted_networks(trusted), KeyFile(keys) if keys else None,
                   rewrite_shared)

    @property
    def proven(self) -> bool:
        """Whether tenants are proven (a key file, or a header trusted from named proxies)."""
        return self.keys is not None or bool(self.header and self.trusted)

    def trusts(self, client: str | None) -> bool:
        try:
            address = ipaddress.ip_address((client or "").strip("[]"))
        except ValueError:
            return False
        return any(address in network for network in self.trusted)

    def identify(self, user: str | None, headers: Mapping[str, str], client: str | None = None) -> Tenant:
        """The tenant of a request from `user` (the signed-in user's name, or None) with `headers`
        (a case-insensitive mapping, as Starlette's) from the address `client`; `Refused` when the
        request must not go upstream at all (see the module docstring)."""
        if user:
            return Tenant("user:" + _digest(user), "user")
        named = self._header(headers, client)
        if self.keys is not None:
            key = _bearer(headers.get("authorization", ""))
            if not key:
                raise Refused(401, "no API key: send 'Authorization: Bearer KEY' with a key of the gateway's "
                                   "key file")
            tenant = self.keys.tenant_of(key)
            if tenant is None:
                raise Refused(401, "the API key is not one of the gateway's keys")
            return named or Tenant("tenant:" + _digest(tenant), "key")
        if named:
            return named
        if self.header:
            if not self.trusts(client):
                raise Refused(403, f"requests reach this gateway through its trusted proxies only "
                                   f"(--trusted-proxies; {client or 'this address'} is not one)")
            return self._none(f"no {self.header} header")
        key = _bearer(headers.get("authorization", ""))
        if not key:
            return self._none("no API key")
        return Tenant("key:" + _digest(key), "key")

    def _header(self, headers: Mapping[str, str], client: str | None) -> Tenant | None:
        """The tenant the trusted proxy's header names (None when absent); `Refused` when it came
        from anywhere else, more than once, or with a comma."""
        if not self.header:
            return None
        getlist = getattr(headers, "getlist", None)
        one = headers.get(self.header)
        values = list(getlist(self.header)) if getlist else ([] if one is None else [one])
        if not values:
            return None
        if not self.trusts(client):
            raise Refused(403, f"the {self.header} header is taken only from the gateway's trusted proxies "
                               f"(--trusted-proxies); {client or 'this address'} is not one")
        if len(values) > 1 or "," in values[0]:
            raise Refused(400, f"the {self.header} header must be set once, with one value (the proxy must "
                               "replace a client's own, not append to it)")
        value = values[0].strip()
        return Tenant("header:" + _digest(value), "header") if value else None

    def _none(self, why: str) -> Tenant:
        if self.rewrite_shared:
            return Tenant(SHARED, SHARED)
        return Tenant("", "none", f"no tenant: {why} (the operator may opt in with --rewrite-shared)")


def _bearer(value: str) -> str:
    scheme, _, rest = value.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" else value.strip()


def _digest(value: str) -> str:
    """A tenant's id: a hash (a key or a name is never stored nor logged)."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:24]
