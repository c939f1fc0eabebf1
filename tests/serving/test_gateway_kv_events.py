"""Routing by the replicas' KV events (issue 50 item 3).

- vLLM's own wire bytes (a `KVEventBatch` as vLLM 0.32's msgspec encoder writes it: BlockStored,
  BlockRemoved, AllBlocksCleared) are read; stored token ids are hashed here, chained per block, and
  a removed block, a clear, a gap in the sequence and a sequence that starts again all forget what
  they should.
- A gateway with `--kv-events` in front of two HTTP peers that publish their cache's changes over
  real ZMQ sockets (`tests.serving.engines.Engine(events=True)`): another gateway (its own memory,
  no events) sent 4 tenants' bases, alternating between the peers; this gateway, which never saw
  those bases, sends each tenant's request to the peer that holds it (in the reverse order, where
  its own round-robin would have sent every one to the other). When a peer restarts, its bases are
  routed afresh (`why="evicted"`), not trusted to the record.
"""

from __future__ import annotations

import time

import httpx
import msgpack
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway.kv_events import KvEvents, chain
from tests.serving.engines import Engine, Gateway

# vLLM 0.32's msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=
# [b'ab'], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None, medium='CPU',
# lora_name=None), BlockRemoved(block_hashes=[b'ab'], medium='CPU'), AllBlocksCleared()]))
VLLM_BATCH = (b"\x93\xcb?\xf0\x00\x00\x00\x00\x00\x00\x93\x88\xa4type\xabBlockStored\xacblock_hashes\x91\xc4"
              b"\x02ab\xb1parent_block_hash\xc0\xa9token_ids\x92\x01\x02\xaablock_size\x02\xa7lora_id\xc0"
              b"\xa6medium\xa3CPU\xa9lora_name\xc0\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\xc4\x02ab"
              b"\xa6medium\xa3CPU\x81\xa4type\xb0AllBlocksCleared\xc0")


def _stored(hashes, parent, tokens, size):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": size, "lora_id": None, "medium": "GPU", "lora_name": None}


def test_vllm_wire_batches_are_hashed_here_and_forgotten_when_they_should_be():
    events = KvEvents({"a": "tcp://127.0.0.1:1", "b": "tcp://127.0.0.1:2"})
    events.apply("a", 0, VLLM_BATCH)  # stored, removed, cleared: nothing left, one clear
    assert events.replicas["a"].stored == 1 and events.replicas["a"].removed == 1
    assert events.replicas["a"].cleared == 1 and events.held("a", chain([1, 2], 2)) == 0
    tokens = list(range(100, 132))  # 4 blocks of 8, stored in two events (the second's parent: the first's)
    pack = msgpack.packb
    events.apply("a", 1, pack([1.0, [_stored([b"h1", b"h2"], None, tokens[:16], 8)], None]))
    events.apply("a", 2, pack([1.0, [_stored([b"h3", b"h4"], b"h2", tokens[16:], 8)], None]))
    ours = chain(tokens, 8)
    assert events.block_size == 8 and len(ours) == 4
    assert events.held("a", ours) == 4 and events.held("b", ours) == 0
    assert events.held("a", chain(tokens[:8] + [0] * 24, 8)) == 1  # the same first block only
    events.apply("a", 3, pack([1.0, [{"type": "BlockRemoved", "block_hashes": [b"h3"], "medium": "GPU"}]]))
    assert events.held("a", ours) == 2  # the run stops at the removed block
    events.apply("a", 5, pack([1.0, [], None]))  # 4 never came: a gap
    assert events.held("a", ours) == 0 and events.replicas["a"].gaps == 1
    events.apply("a", 6, pack([1.0, [_stored([b"h1", b"h2", b"h3", b"h4"], None, tokens, 8)], None]))
    assert events.held("a", ours) == 4
    events.apply("a", 0, pack([1.0, [], None]))  # the sequence starts again: a restart
    assert events.held("a", ours) == 0 and events.replicas["a"].cleared == 3
    events.apply("b", 9, pack([1.0, [_stored([b"x2"], b"unknown", tokens[8:16], 8)], None]))
    assert events.replicas["b"].orphans == 1 and events.held("b", ours) == 0  # no parent: not hashed
    salted = {**_stored([b"s1", b"s2"], None, tokens[:16], 8), "extra_keys": [["salt-of-a"], None]}
    events.apply("b", 10, pack([1.0, [salted], None]))  # tenant A's salt is in its first block
    assert events.held("b", chain(tokens, 8, salt="salt-of-a")) == 2
    assert events.held("b", chain(tokens, 8, salt="salt-of-b")) == 0 and events.held("b", ours) == 0


LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))


def ask(gateway: Gateway, tenant: int) -> httpx.Response:
    system = f"You are agent {tenant}.\nrecord_id: SR-{20400 + tenant}\ndestination: Oslo\n\n{LOG}"
    body = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Where to?"}]}
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                        headers={"Authorization": f"Bearer sk-tenant-{tenant}"})
    assert answer.status_code == 200, answer.text
    return answer


def _metric(gateway: Gateway, name: str) -> dict[str, float]:
    text = httpx.get(f"{gateway.url}/metrics").text
    return {next(iter(s.labels.values()), ""): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def _until(check, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def _where(engines: list[Engine], tenant: int) -> list[int]:
    marker = f"record_id: SR-{20400 + tenant}\n"
    return [i for i, e in enumerate(engines) for body in e.completions
            if marker in body["messages"][0]["content"]]


def test_a_gateway_with_kv_events_sends_each_base_where_a_replica_holds_it(tmp_path):
    engines = [Engine("vllm", events=True), Engine("vllm", events=True)]
    upstreams = ("--upstream", f"{engines[1].url}/v1", "--check-rate", "0")
    events = ("--kv-events", engines[0].events_url, "--kv-events", engines[1].events_url)
    watching = Gateway(tmp_path / "events", f"{engines[0].url}/v1", *upstreams, *events)
    blind = Gateway(tmp_path / "blind", f"{engines[0].url}/v1", *upstreams)
    try:
        def subscribed() -> bool:  # ZMQ's slow joiner: publish until both subscriptions carry
            for engine in engines:
                with engine.lock:
                    engine.publish([])
            return len([v for v in _metric(watching, "kvnotes_gateway_kv_events_batches_total").values()
                        if v > 0]) == 2

        assert _until(subscribed)
        for tenant in range(4):  # the blind gateway spreads the bases: 0, 2 on one peer, 1, 3 on the other
            ask(blind, tenant)
        homes = {t: _where(engines, t)[0] for t in range(4)}
        assert sorted(homes.values()) == [0, 0, 1, 1]
        assert _until(lambda: all(v > 0 for v in _metric(
            watching, "kvnotes_gateway_kv_events_blocks_held").values()))
        for tenant in reversed(range(4)):  # its own round-robin would send each to the other peer
            ask(watching, tenant)
            assert _where(engines, tenant)[-1] == homes[tenant] and len(_where(engines, tenant)) == 2
        assert _metric(watching, "kvnotes_gateway_routes_total")["events"] == 4
        restarted = homes[0]
        engines[restarted].restart()  # its cache is gone: its bases are routed afresh, not trusted
        assert _until(lambda: sum(_metric(watching, "kvnotes_gateway_kv_events_cleared_total").values()) >= 1)
        for tenant in (t for t in range(4) if homes[t] == restarted):
            ask(watching, tenant)
        assert _metric(watching, "kvnotes_gateway_routes_total")["evicted"] == 2
    finally:
        for gateway in (watching, blind):
            gateway.stop()
        for engine in engines:
            engine.close()

