"""Where a replay may send requests: an address is checked before any connection is made.

`check_target(url, refused)` refuses, whatever the server is:
- a URL carrying a user name or password (`user:pw@host`);
- a host written as a number other than four decimal parts (`2130706433`, `127.1`, `0x7f.0.0.1`),
  which resolvers read as addresses nobody would recognise;
- an unspecified (`0.0.0.0`, `::`), link-local (`169.254.0.0/16` — cloud metadata —, `fe80::/10`),
  multicast or reserved address, or IPv6's loopback (`[::1]`, said so: a server on this machine is
  reached at 127.0.0.1), by the host as written or by any address its name resolves to;
- a port of a database or message broker (`SERVICE_PORTS`, and those the caller names in
  `refused`: the ports of the app's own database, broker and result backend).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

# PostgreSQL, MySQL, Redis, AMQP (RabbitMQ, with its management, clustering and epmd ports),
# MongoDB, memcached, Kafka, ZooKeeper, etcd, Elasticsearch, MSSQL, Oracle, CouchDB, Cassandra.
SERVICE_PORTS = frozenset({5432, 3306, 6379, 5672, 5671, 15672, 25672, 4369, 27017, 11211, 9092, 2181,
                           2379, 2380, 9200, 9300, 1433, 1521, 5984, 9042})
_DECIMAL_QUAD = re.compile(r"^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$")
_NUMERIC = re.compile(r"^[0-9a-fx.]+$")


class TargetRefused(ValueError):
    """An address a replay may never reach; the message says why, naming no more than the URL."""


@dataclass(frozen=True)
class Target:
    """A checked server: scheme, host (as written, lowercased), port and the addresses it resolved to."""

    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def _refused_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    if address.is_unspecified:
        return "an unspecified address (it means every interface)"
    if address.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if address.version == 6 and address.is_loopback:  # ::1 lies in ::/8, which Python calls reserved
        return ("IPv6's loopback address; a server on this machine is reached at 127.0.0.1 "
                "(http://127.0.0.1:PORT/v1)")
    if address.is_multicast or address.is_reserved:
        return "a multicast or reserved address"
    return None


def check_target(url: str, refused: Iterable[int] = (), resolve: bool = True) -> Target:
    """The target of `url` (http or https), or `TargetRefused` saying why it may not be reached.
    `refused`: ports never to reach besides `SERVICE_PORTS`, on any host."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"server URL must start with http:// or https://, got {url[:200]!r}")
    if "@" in parts.netloc:
        raise TargetRefused("server URL must not carry a user name or password (user:pw@host)")
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise TargetRefused(f"server URL {url[:200]!r} has no valid port") from None
    if not host:
        raise TargetRefused(f"server URL {url[:200]!r} names no host")
    literal = None
    if ":" in host:
        try:
            literal = ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise TargetRefused(f"server URL {url[:200]!r} is not a valid address") from None
    elif _NUMERIC.match(host):
        if not _DECIMAL_QUAD.match(host):
            raise TargetRefused(f"write the server's address as four decimal numbers (a.b.c.d), not {host!r}")
        literal = ipaddress.IPv4Address(host)
    if port in SERVICE_PORTS or port in set(refused):
        raise TargetRefused(f"port {port} is a database's or a message broker's, never a vLLM server's")
    if literal is not None:
        addresses = (str(literal),)
    elif not resolve:
        addresses = ()
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            infos = []
        addresses = tuple(dict.fromkeys(info[4][0] for info in infos))
    for address in addresses:
        reason = _refused_address(ipaddress.ip_address(address.split("%")[0]))
        if reason:
            raise TargetRefused(f"the server at {parts.scheme}://{parts.netloc} is {reason}; "
                                "a replay never reaches one")
    return Target(parts.scheme, host, port, addresses)
