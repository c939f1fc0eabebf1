"""What each replica says its prefix cache holds: vLLM's KV events (`--kv-events-config
'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'`), read by
`kvnotes gateway --kv-events tcp://HOST:5557` (one per `--upstream`, in the same order).

The wire (vLLM's `vllm/distributed/kv_events.py`, `ZmqEventPublisher`): a ZMQ PUB socket sends
multipart messages (topic, an 8-byte big-endian sequence number, a msgpack payload). The payload is
a `KVEventBatch`, an array `[ts, events, data_parallel_rank]`; each event a map tagged by `type`:
`BlockStored` (`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, ...),
`BlockRemoved` (`block_hashes`) or `AllBlocksCleared`.

vLLM's block hashes are seeded per process (and salted per request), so they are not trusted: each
stored block's token ids are hashed here, SHA-256 chained from its parent's hash as the KV store
chains its blocks (`worker.engine.store`: a root of the model and block size, then
`sha256(len|"block"|len|parent|len|ids)` per block), and vLLM's hash is kept only to find a block's
parent and to remove it. A request's `cache_salt` (issue 48: one per tenant) is in the chain's
root, read from the first block's `extra_keys`, so a tenant's blocks match only that tenant's
requests, as in vLLM's cache. Per replica: the set of our hashes it holds. `AllBlocksCleared`, a sequence
number that does not follow the last (a gap: events were lost), or one that goes back (the replica
restarted) empties that replica's set: what it held is unknown, so its bases are routed afresh
(`serving.gateway.router`).

One thread polls every subscription; each message's handling is timed (`seconds`) and counted, so
what events cost is on `/metrics` (`kvnotes_gateway_kv_events_*`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from vocabulary.prefix import hash_parts, next_block

log = logging.getLogger("kvnotes.gateway")
POLL_MS = 200


def root(block_size: int, model: str = "", salt: str = "") -> str:
    """The hash a chain starts from: the model, the block size and the request's `cache_salt` (vLLM
    hashes it into the first block, so a tenant's salted blocks are that tenant's only)."""
    return hash_parts(b"root", model.encode(), str(block_size).encode(), salt.encode())


def chain(tokens: Sequence[int], block_size: int, model: str = "", salt: str = "") -> list[str]:
    """Our hashes of the full blocks of `tokens`, each chained from the one before."""
    prev = root(block_size, model, salt)
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        ids = tokens[start:start + block_size]
        prev = next_block(prev, ids)
        out.append(prev)
    return out


@dataclass
class Replica:
    """What one replica holds, by our hashes, and how its event stream went."""

    name: str
    endpoint: str
    ours: dict[object, str] = field(default_factory=dict)  # vLLM's hash -> ours
    held: set[str] = field(default_factory=set)
    last_seq: int | None = None
    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0  # AllBlocksCleared, gaps and restarts: the set emptied
    gaps: int = 0
    orphans: int = 0  # blocks whose parent was unknown (not hashed: they cannot be matched)
    seconds: float = 0.0

    def clear(self) -> None:
        self.ours.clear()
        self.held.clear()
        self.cleared += 1


class KvEvents:
    """The replicas' holdings, kept from their events by one thread (`start`, `close`)."""

    def __init__(self, endpoints: dict[str, str], model: str = "") -> None:
        self.replicas = {name: Replica(name, endpoint) for name, endpoint in endpoints.items()}
        self.model = model
        self.block_size: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the router asks --------------------------------------------------------------------------

    def chain(self, tokens: Sequence[int], salt: str = "") -> list[str]:
        return chain(tokens, self.block_size or 1, self.model, salt)

    def held(self, name: str, hashes: Sequence[str]) -> int:
        """How many of `hashes`' leading blocks the replica `name` holds."""
        with self._lock:
            replica = self.replicas.get(name)
            if replica is None:
                return 0
            n = 0
            for h in hashes:
                if h not in replica.held:
                    break
                n += 1
            return n

    # --- events ------------------------------------------------------------------------------------------

    def apply(self, name: str, seq: int, payload: bytes) -> None:
        """One message of replica `name`: its sequence checked, its batch applied."""
        import msgpack

        started = time.perf_counter()
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        with self._lock:
            replica = self.replicas[name]
            if replica.last_seq is not None and seq != replica.last_seq + 1:
                replica.gaps += 1
                log.warning("gateway kv events: a gap or a restart, the replica's blocks are forgotten",
                            extra={"upstream": name, "seq": seq, "last": replica.last_seq})
                replica.clear()
            replica.last_seq = seq
            replica.batches += 1
            for event in batch[1] if isinstance(batch, list) and len(batch) > 1 else ():
                self._event(replica, event)
            replica.seconds += time.perf_counter() - started

    def _event(self, replica: Replica, event: dict) -> None:
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "BlockStored":
            size = int(event["block_size"])
            self.block_size = size  # the latest said (every replica of one model has one size)
            parent = event.get("parent_block_hash")
            prev = (root(size, self.model, _salt(event.get("extra_keys"))) if parent is None
                    else replica.ours.get(_key(parent)))
            tokens = event["token_ids"]
            for i, vllm_hash in enumerate(event["block_hashes"]):
                if prev is None:
                    replica.orphans += 1
                    continue
                ids = tokens[i * size:(i + 1) * size]
                prev = next_block(prev, ids)
                replica.ours[_key(vllm_hash)] = prev
                replica.held.add(prev)
                replica.stored += 1
        elif kind == "BlockRemoved":
            for vllm_hash in event["block_hashes"]:
                ours = replica.ours.pop(_key(vllm_hash), None)
                if ours is not None:
                    replica.held.discard(ours)
                    replica.removed += 1
        elif kind == "AllBlocksCleared":
            replica.clear()

    # --- the thread --------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._listen, name="gateway-kv-events", daemon=True)
            self._thread.start()

    def _listen(self) -> None:
        import zmq

        context = zmq.Context()
        sockets = {}
        poller = zmq.Poller()
        for name, replica in self.replicas.items():
            sock = context.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(replica.endpoint)
            sockets[sock] = name
            poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(POLL_MS):
                    parts = sock.recv_multipart()
                    if len(parts) != 3 or len(parts[1]) != 8:
                        continue
                    try:
                        self.apply(sockets[sock], int.from_bytes(parts[1], "big"), parts[2])
                    except Exception:  # a message we cannot read must not end the subscription
                        log.exception("gateway kv events: a message could not be read",
                                      extra={"upstream": sockets[sock]})
        finally:
            for sock in sockets:
                sock.close(0)
            context.term()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def collect(self):
        """The per-replica families for /metrics (this process's counts)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def family(name: str, doc: str, kind=CounterMetricFamily):
            return kind(f"kvnotes_gateway_kv_events_{name}", doc, labels=["upstream"])

        families = [(family("batches", "Event batches read from one replica."), "batches"),
                    (family("blocks_stored", "Blocks it said it stored (hashed here)."), "stored"),
                    (family("blocks_removed", "Blocks it said it removed."), "removed"),
                    (family("cleared", "Times its blocks were forgotten: cleared, a gap, a restart."),
                     "cleared"),
                    (family("seconds", "Seconds this process spent reading its events."), "seconds")]
        with self._lock:
            replicas = list(self.replicas.values())
            held = {r.name: len(r.held) for r in replicas}
        for f, attr in families:
            for r in replicas:
                f.add_metric([r.name], float(getattr(r, attr)))
            yield f
        blocks = family("blocks_held", "Blocks one replica holds now, as its events say.", GaugeMetricFamily)
        for name, n in held.items():
            blocks.add_metric([name], n)
        yield blocks


def _salt(extra_keys: object) -> str:
    """The `cache_salt` of a chain's first block from its event's extra keys (vLLM publishes, per
    block, the LoRA name, multimodal pairs, then the salt: the last text of the first block's)."""
    if not isinstance(extra_keys, list | tuple) or not extra_keys:
        return ""
    first = extra_keys[0]
    texts = [k for k in first if isinstance(k, str)] if isinstance(first, list | tuple) else []
    return texts[-1] if texts else ""


def _key(block_hash: object) -> object:
    """vLLM's block hash as a dict key (bytes or an int on the wire; a list would not hash)."""
    return tuple(block_hash) if isinstance(block_hash, list) else block_hash
