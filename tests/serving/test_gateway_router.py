"""Several upstreams behind one gateway (issue 50): each tenant's prompts go where its prefix is cached.

The upstreams are real HTTP peers speaking vLLM's API (`tests.serving.engines.Engine`), each with an
exact prefix cache of its own: it answers `cached_tokens` for the longest prefix it has seen. The
routing table is in the real Redis at 127.0.0.1:6379 (each test under its own key prefix):

- 8 tenants, each a base and 4 changed fields, through one `kvnotes gateway --state` in front of two
  upstreams: every tenant's 5 requests reach one upstream, each upstream serves at least 2 tenants,
  and the later requests' cached share is at least 0.85 (round-robin, the same requests: about half);
- a second gateway process on the same state sends each tenant's next request to the same upstream;
- one upstream stopped: every tenant's next request is answered by the other, never a 5xx;
- `/metrics` counts the requests per upstream.
"""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.engines import Engine, Gateway

REDIS = "redis://127.0.0.1:6379/0"
LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))
CITIES = ["Oslo", "Madrid", "Rome", "Lisbon", "Paris", "Bergen", "Turin", "Porto"]
TENANTS = 8



def _system(tenant: int, city: str) -> str:
    return (f"You are agent {tenant} of the shipping desk.\nrecord_id: SR-{20400 + tenant}\n"
            f"destination: {city}\ncarrier: NordFreight\n\n{LOG}")


def ask(gateway: Gateway, tenant: int, city: str) -> httpx.Response:
    body = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": _system(tenant, city)},
                         {"role": "user", "content": "What is the destination of this shipment?"}]}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer sk-tenant-{tenant}"})


def _where(engines: list[Engine], tenant: int) -> list[int]:
    """Which engine got each of the tenant's requests, in order of arrival on each."""
    marker = f"record_id: SR-{20400 + tenant}\n"
    return [i for i, e in enumerate(engines) for body in e.completions
            if marker in body["messages"][0]["content"]]


def _per_upstream(gateway: Gateway, engines: list[Engine]) -> list[float]:
    text = httpx.get(f"{gateway.url}/metrics").text
    counts = {s.labels["upstream"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "kvnotes_gateway_upstream_requests_total"}
    return [sum(v for name, v in counts.items() if name.startswith(e.url)) for e in engines]


def test_each_tenant_stays_on_one_replica_across_gateways_and_fails_over(tmp_path, prefix):
    engines = [Engine("vllm"), Engine("vllm")]
    options = ("--upstream", f"{engines[1].url}/v1", "--check-rate", "0", "--state", f"{REDIS}#{prefix}")
    first = Gateway(tmp_path / "g1", f"{engines[0].url}/v1", *options)
    second = None
    try:
        later_prompt = later_cached = 0
        for round_ in range(5):  # the tenants' bases, then 4 changed fields, interleaved
            for tenant in range(TENANTS):
                answer = ask(first, tenant, CITIES[(tenant + round_) % len(CITIES)])
                assert answer.status_code == 200, answer.text
                expected = "pass-through; reason=new base" if round_ == 0 else "erratum"
                assert answer.headers["x-kvnotes-gateway"] == expected
                if round_:
                    usage = answer.json()["usage"]
                    later_prompt += usage["prompt_tokens"]
                    later_cached += usage["prompt_tokens_details"]["cached_tokens"]
        homes = {}
        for tenant in range(TENANTS):
            where = _where(engines, tenant)
            assert len(where) == 5 and len(set(where)) == 1, (tenant, where)  # one replica each
            homes[tenant] = where[0]
        assert min(list(homes.values()).count(i) for i in range(2)) >= 2, homes  # each serves >= 2 tenants
        for body in (b for e in engines for b in e.completions):  # no request carries two tenants' text
            text = "".join(m["content"] for m in body["messages"])
            assert sum(f"record_id: SR-{20400 + t}\n" in text for t in range(TENANTS)) == 1
        assert later_cached / later_prompt >= 0.85, later_cached / later_prompt
        assert _per_upstream(first, engines) == [len(e.completions) for e in engines]  # /metrics per upstream

        second = Gateway(tmp_path / "g2", f"{engines[0].url}/v1", *options)
        for tenant in range(TENANTS):
            answer = ask(second, tenant, "Lyon")
            assert answer.status_code == 200 and answer.headers["x-kvnotes-gateway"] == "erratum"
            assert _where(engines, tenant)[-1] == homes[tenant] and len(_where(engines, tenant)) == 6
        assert sum(_per_upstream(second, engines)) == TENANTS

        engines[0].kill()  # one replica stops: its tenants' next requests go to the other
        for tenant in range(TENANTS):
            gateway = (first, second)[tenant % 2]
            answer = ask(gateway, tenant, "Malmo")
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == "The destination is Malmo."
        assert all(_where(engines, t)[-1] == 1 for t in range(TENANTS))
        moved = [t for t in range(TENANTS) if homes[t] == 0]
        for tenant in moved:  # recorded with the other now: their next requests stay there, cached
            answer = ask(first, tenant, "Oslo")
            assert answer.status_code == 200
            assert _where(engines, tenant)[-1] == 1
            usage = answer.json()["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"] > 0.85
        text = httpx.get(f"{first.url}/metrics").text
        up = [s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "kvnotes_gateway_upstream_up"]
        assert sorted(up) == [0.0, 1.0]  # the stopped one is out of rotation
    finally:
        for gateway in (first, second):
            if gateway is not None:
                gateway.stop()
        for engine in engines:
            engine.close()


def test_a_base_leaves_its_replica_only_past_the_overload_bound_or_when_it_is_out():
    """The router on two real peers (their loads set as a health check would read them): a base stays
    on its replica while it is at most `overload` requests busier than the other, moves past that
    (and is recorded there), and moves when its replica is out of rotation."""
    from serving import connect
    from serving.gateway.memory_state import MemoryState
    from serving.gateway.router import Router
    from serving.gateway.state import Base, Limits
    from serving.gateway.upstreams import Pool, Upstream

    engines = [Engine("vllm"), Engine("vllm")]
    try:
        pool = Pool([Upstream(connect(f"{e.url}/v1"), connect(f"{e.url}/v1")) for e in engines])
        state = MemoryState(Limits())
        state.save("tenant-a", Base("b1", "m", "/chat/completions", ["system"], ["text"]), texts=True)
        router = Router(pool, state, overload=16)
        a, b = pool.upstreams
        first = router.choose("tenant-a", "b1", {})
        assert first.why == "first" and state.index("tenant-a")[0].replica == first.upstream.name
        home, other = (a, b) if first.upstream is a else (b, a)
        home.reported, other.reported = 16.0, 0.0  # at the bound: it stays
        assert router.choose("tenant-a", "b1", {}) == type(first)(home, "recorded")
        home.reported = 17.0  # past it: the base moves, and is recorded with the other
        assert router.choose("tenant-a", "b1", {}).upstream is other
        assert state.index("tenant-a")[0].replica == other.name
        home.reported = 0.0
        other.breaker.failure()  # its new replica is out: back to the first
        moved = router.choose("tenant-a", "b1", {})
        assert (moved.upstream, moved.why) == (home, "out")
        assert router.choose("tenant-a", None, {}).why == "least_loaded"  # no base: the least loaded
        assert router.choices["recorded"] == 1 and router.choices["overloaded"] == 1
    finally:
        for engine in engines:
            engine.close()


def _loads(gateway: Gateway) -> list[float]:
    text = httpx.get(f"{gateway.url}/metrics").text
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "kvnotes_gateway_upstream_load"]


def test_a_client_gone_before_the_first_chunk_gives_its_upstream_back(tmp_path):
    """A streamed request whose client leaves while the upstream is still silent: the answer's first
    `send` fails, so its stream never starts; the upstream's in-flight count must still go back to 0
    (else the router reads that replica as busier for good, one request per client that left)."""
    engine = Engine("vllm", fault="slow", delay_s=2.0)
    gateway = Gateway(tmp_path / "g", f"{engine.url}/v1", "--check-rate", "0")
    try:
        body = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "What is the destination of this shipment?"}]}
        for _ in range(3):
            with pytest.raises(httpx.ReadTimeout):
                with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=0.5) as r:
                    r.read()
        assert len(_loads(gateway)) == 1 and _loads(gateway)[0] >= 1  # in flight while the upstream waits
        deadline = time.monotonic() + 30
        while _loads(gateway) != [0.0] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _loads(gateway) == [0.0]
    finally:
        gateway.stop()
        engine.close()
