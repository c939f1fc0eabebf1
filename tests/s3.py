"""A real SeaweedFS S3 server for the tests, started from `scripts/s3.sh` (issue 40).

`s3_server` (tests/conftest.py) is one server per test run, shared; a test that stops the server or
damages its objects starts its own with `seaweedfs(folder)`. Every test writes under a prefix of its
own (`S3Server.store_url()`), so tests sharing the server never see each other's objects.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import obstore
from obstore.store import S3Store

from tests.conftest import REPO, missing
from worker.engine.store import KVStore
from worker.engine.store_s3 import SharedConfig, parse_store_url

SCRIPT = REPO / "scripts" / "s3.sh"
REDIS_URL = os.environ.get("KVNOTES_TEST_REDIS", "redis://127.0.0.1:6379/0")


@dataclass
class S3Server:
    """One `scripts/s3.sh` server: its folder, port, the variables it printed, its process."""

    folder: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return self.env["KVNOTES_S3_ENDPOINT"]

    def store_url(self) -> str:
        """A fresh s3://BUCKET/PREFIX for one test."""
        return f"{self.env['KVNOTES_STORE_URL']}/{uuid.uuid4().hex[:12]}"

    def start(self) -> S3Server:
        """Start (or start again, on the same folder and port) and wait for its `export` lines."""
        self.proc = subprocess.Popen([str(SCRIPT), "--port", str(self.port), "--dir", str(self.folder)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        lines = [self.proc.stdout.readline() for _ in range(5)]
        if not all(line.startswith("export ") for line in lines):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            missing(f"scripts/s3.sh did not start: {''.join(lines)} {err}")
        self.env = dict(line.removeprefix("export ").strip().split("=", 1) for line in lines)
        return self

    def stop(self) -> None:
        """Stop the script and the weed it started (their own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_port() -> int:
    """A port P for `scripts/s3.sh` whose 16 ports (P..P+7 and P+10000..P+10007) are all free and all
    below the kernel's ephemeral range (32768 up): a port from bind(0) lies inside it, where any
    client's outgoing connection may take P+7 before weed binds it (seen: "port 49470 for WebDAV
    ... is not available"), or while a stopped server is down, before it starts again."""
    lowest = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) \
        if Path("/proc/sys/net/ipv4/ip_local_port_range").exists() else 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(11000, min(22000, lowest - 10008))
        if all(_bindable(p) for base in (port, port + 10000) for p in range(base, base + 8)):
            return port
    raise RuntimeError("no 16 free ports for SeaweedFS below the ephemeral range")


@contextmanager
def seaweedfs(folder: Path) -> Iterator[S3Server]:
    """A server of its own (its other parts take the 7 ports above it and +10000), out of the
    ephemeral port range (`server_port`)."""
    server = S3Server(folder, server_port()).start()
    try:
        yield server
    finally:
        server.stop()


def aws_env(server: S3Server) -> dict[str, str]:
    """The credential variables a client of `server` needs."""
    return {k: v for k, v in server.env.items() if k.startswith("AWS_")}


def shared_store(root: Path, server: S3Server, url: str, **kw) -> KVStore:
    """A store under `root` with `url` on `server` behind it (credentials from its variables)."""
    os.environ.update(aws_env(server))  # obstore reads the credentials from the environment
    config = SharedConfig(url=url, endpoint=server.endpoint, index_url=REDIS_URL, **kw)
    return KVStore(root, block_tokens=16, shared=config)


def objects(server: S3Server, url: str) -> dict[str, int]:
    """Every object under the store URL's prefix: path → size."""
    bucket, prefix = parse_store_url(url)
    s3 = S3Store(bucket, endpoint=server.endpoint, region="us-east-1", virtual_hosted_style_request=False,
                 client_options={"allow_http": True})
    return {o["path"]: o["size"] for batch in obstore.list(s3, prefix + "/") for o in batch}


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never answers; yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        for conn in held:
            conn.close()
        sock.close()
