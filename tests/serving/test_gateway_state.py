"""The gateway's shared state (issue 39 items 1 and 5) on the real Redis at 127.0.0.1:6379 (each test
under its own key prefix, removed after it), and in memory (the same interface):

- two `kvnotes gateway` processes on one `--state`, requests alternating between them: one base, the
  upstream gets it unchanged once and every later request rewritten; their `/metrics` sum exactly;
- a Redis that cannot be reached: every request passes through saying so, never a 5xx;
- bounds: 40 bases of one tenant leave 16, and /metrics (prometheus_client's parser: each family
  once) has no per-base series (the page lists the 16); statistics go with their base; tenants past
  the overall bound go least recent first; a base past its TTL is gone;
- eight threads of two rewriters (two processes' worth) asking the same new prompt at once start one
  base, not one each.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway.memory_state import MemoryState
from serving.gateway.prompts import CHAT, read_prompt
from serving.gateway.redis_state import RedisState
from serving.gateway.rewrite import Rewriter, Settings
from serving.gateway.stats import Stats
from tests.serving.engines import SECRET_KEY, Engine, Gateway

REDIS = "redis://127.0.0.1:6379/0"
LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))
SYSTEM = "You are the shipping agent.\nrecord_id: SR-20417\ndestination: {}\ncarrier: NordFreight\n\n" + LOG
CITIES = ["Oslo", "Madrid", "Rome", "Lisbon", "Paris", "Bergen", "Turin", "Porto", "Lyon", "Malmo"]



def _eventually(check, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _chat(city: str, topic: str = "") -> dict:
    return {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": topic or SYSTEM.format(city)},
                         {"role": "user", "content": "What is the destination of this shipment?"}]}


def _families(text: str) -> dict[str, list]:
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), names  # each family once
    return {f.name: f.samples for f in families}


def _value(families: dict[str, list], sample: str, **labels: str) -> float:
    return sum(s.value for f in families.values() for s in f if s.name == sample
               and all(s.labels.get(k) == v for k, v in labels.items()))


def test_two_gateway_processes_on_one_state_send_one_base(tmp_path, prefix):
    engine = Engine("vllm")
    state = f"{REDIS}#{prefix}"
    gateways = [Gateway(tmp_path / f"g{i}", f"{engine.url}/v1", "--check-rate", "0", "--state", state,
                        wait=False) for i in range(2)]
    try:
        for gateway in gateways:
            gateway.ready()
        headers, answers = [], []
        for i, city in enumerate(CITIES):
            answer = httpx.post(f"{gateways[i % 2].url}/v1/chat/completions", json=_chat(city),
                                headers={"Authorization": "Bearer sk-shipping"}, timeout=30)
            assert answer.status_code == 200, answer.text
            headers.append(answer.headers["x-kvnotes-gateway"])
            answers.append(answer.json()["choices"][0]["message"]["content"])
        assert headers == ["pass-through; reason=new base"] + ["erratum"] * 9
        assert answers == [f"The destination is {c}." for c in CITIES]
        sent = [b["messages"][0]["content"] for b in engine.completions]
        assert sum(s == SYSTEM.format("Oslo") for s in sent) == 1  # the base went upstream once
        assert all(s.startswith(SYSTEM.format("Oslo")) for s in sent)  # every request on that one base
        seen = [_families(httpx.get(f"{g.url}/metrics").text) for g in gateways]
        # each process exports its own counters: their sum (PromQL's sum()) is the exact total
        assert [_value(f, "kvnotes_gateway_requests_total") for f in seen] == [5, 5]
        assert sum(_value(f, "kvnotes_gateway_rewrites_total") for f in seen) == 9
        for gateway in gateways:  # the state's own gauge, the same in each (the flusher reads it)
            assert gateway.eventually("kvnotes_gateway_bases", 1)
    finally:
        for gateway in gateways:
            gateway.stop()
        engine.close()


def test_an_unreachable_state_passes_through_and_says_so(tmp_path):
    engine = Engine("vllm")
    gateway = Gateway(tmp_path, f"{engine.url}/v1", "--check-rate", "0", "--state", "redis://127.0.0.1:9/0")
    try:
        for city in CITIES[:3]:
            answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=_chat(city),
                                headers={"Authorization": "Bearer sk-shipping"}, timeout=30)
            assert answer.status_code == 200
            assert answer.headers["x-kvnotes-gateway"] == ("pass-through; reason=the shared state is "
                                                           "unreachable")
            assert answer.json()["choices"][0]["message"]["content"] == f"The destination is {city}."
        metrics = httpx.get(f"{gateway.url}/metrics")
        assert metrics.status_code == 200
        assert _value(_families(metrics.text), "kvnotes_gateway_state_up") == 0
        assert "gateway state unreachable: the request passes through" in gateway.log.read_text()
    finally:
        gateway.stop()
        engine.close()


def _topic(i: int) -> str:
    return f"TOPIC {i}\n" + "".join(f"{i} line {n}: the subject {i} is discussed.\n" for n in range(30))


def _plan(rewriter: Rewriter, tenant: str, text: str):
    prompt, why = read_prompt(CHAT, _chat("", text))
    return rewriter.plan(tenant, prompt, why)


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_forty_bases_leave_sixteen_and_their_statistics_go_with_them(prefix, where):
    settings = Settings(check_rate=0)
    state = MemoryState(settings.limits) if where == "memory" else RedisState(REDIS, settings.limits, prefix)
    rewriter = Rewriter(settings, stats=Stats(state))
    first = _plan(rewriter, "tenant-a", _topic(0))
    rewriter.checked(first.base_id, True, 100)
    for i in range(1, 40):
        assert _plan(rewriter, "tenant-a", _topic(i)).reason == "new base"
    assert state.sizes() == (1, 16)
    families = _families(rewriter.stats.prometheus().decode())
    assert not [s for f in families.values() for s in f if "base" in s.labels]  # no per-base series
    rows = [row.base_id for row in rewriter.stats.rows()]  # the page lists them
    assert len(rows) == 16 and first.base_id not in rows
    assert state.read(first.base_id) == [{}]  # its counts went with it
    assert _value(families, "kvnotes_gateway_requests_total") == 40
    assert _value(families, "kvnotes_gateway_check_prompt_tokens_total") == 100  # the totals stay
    assert _plan(rewriter, "tenant-a", _topic(0)).reason == "new base"  # forgotten
    assert _plan(rewriter, "tenant-a", _topic(39)).header == "erratum"  # kept
    assert _plan(rewriter, "tenant-b", _topic(39)).reason == "new base"  # another tenant's: never shared
    state.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_tenants_past_the_overall_bound_and_bases_past_the_ttl_go(prefix, where):
    settings = Settings(check_rate=0, clients=2)
    state = MemoryState(settings.limits) if where == "memory" else RedisState(REDIS, settings.limits, prefix)
    rewriter = Rewriter(settings, stats=Stats(state))
    for tenant in ("a", "b", "c"):
        _plan(rewriter, tenant, _topic(1))
    assert state.sizes() == (2, 2)
    assert _plan(rewriter, "a", _topic(1)).reason == "new base"  # a, the least recent, went whole
    assert _plan(rewriter, "c", _topic(1)).header == "erratum"
    old = _plan(rewriter, "c", _topic(2)).base_id
    if where == "memory":
        state._used[old] -= 2 * settings.ttl_s
    else:
        state.r.zadd(f"{prefix}u:c", {old: 1.0})  # last used in 1970
    assert _plan(rewriter, "c", _topic(2)).reason == "new base"  # past the TTL: gone
    assert state.read(old) == [{}]
    state.close()


def test_two_processes_asking_the_same_new_prompt_at_once_start_one_base(prefix):
    """Two rewriters on one Redis (as two processes), eight threads, the same new prompt: the
    tenant's lock makes one of them the base, and the others rewrite on it."""
    settings = Settings(check_rate=0)
    rewriters = [Rewriter(settings, stats=Stats(RedisState(REDIS, settings.limits, prefix)))
                 for _ in range(2)]
    plans: list = []
    start = threading.Barrier(8)

    def ask(i: int) -> None:
        start.wait()
        plans.append(_plan(rewriters[i % 2], "tenant-a", SYSTEM.format(CITIES[i])))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.header for p in plans) == ["erratum"] * 7 + ["pass-through; reason=new base"]
    assert len({p.base_id for p in plans}) == 1
    assert rewriters[0].state.sizes() == (1, 1)


def test_serve_uses_the_brokers_redis_under_a_prefix_of_its_deployment():
    from types import SimpleNamespace

    from app.services.gateway import state_url

    def url(state: str = "", broker: str = "redis://10.0.0.5:6379/1", database: str = "postgresql://db/a"):
        return state_url(SimpleNamespace(gateway_state=state, broker_url=broker, database_url=database))

    assert url().startswith("redis://10.0.0.5:6379/1#kvnotes:gateway:")
    assert url() != url(database="postgresql://db/b")  # two deployments on one Redis never meet
    assert url("redis://other:6379/3") == "redis://other:6379/3"
    assert url("memory") == "memory"
    assert url(broker="sqla+sqlite:///var/broker.db") == ""  # each process's memory


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_a_base_that_grows_past_the_cap_by_new_turns_goes(prefix, where):
    """The cap was checked only for new bases: a conversation's turns grew its base past it."""
    settings = Settings(check_rate=0, chars_per_client=3000)
    state = MemoryState(settings.limits) if where == "memory" else RedisState(REDIS, settings.limits, prefix)
    rewriter = Rewriter(settings, stats=Stats(state))

    def turns(n: int) -> dict:
        messages = [{"role": "system", "content": _topic(1)}]
        for i in range(n):
            messages += [{"role": "user", "content": f"question {i}"},
                         {"role": "assistant", "content": "x" * 1000}]
        return {"model": "m", "messages": messages + [{"role": "user", "content": "?"}]}

    for n, kept in ((0, 1), (1, 1), (2, 0)):  # 1.2k characters, then 2.2k, then 3.2k: over 3,000
        prompt, why = read_prompt(CHAT, turns(n))
        rewriter.plan("tenant-a", prompt, why)
        assert state.sizes()[1] == kept
    state.close()


BODY = "record_id: SR-20417\ndestination: {}\nstatus: {}\n\n" + "\n".join(
    f"2026-03-01 08:{i:02d} The carrier confirmed step {i}." for i in range(40))


def _turns(*contents: str) -> dict:
    roles = ["system"] + ["user", "assistant"] * len(contents)
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in zip(roles, contents)]}


def test_errata_and_hoisted_spans_survive_the_trip_between_processes(prefix):
    """Two rewriters on one Redis, taking turns: the errata told in earlier turns, the pending turn's
    errata and the hoisted spans are read back by the other exactly as the one process kept them."""
    from vocabulary import render_erratum

    def two(layout: str) -> list[Rewriter]:
        settings = Settings(layout=layout, check_rate=0)
        return [Rewriter(settings, stats=Stats(RedisState(REDIS, settings.limits, f"{prefix}{layout}:")))
                for _ in range(2)]

    rewriters = two("erratum")
    asks = [_turns(BODY.format("Oslo", "open"), "Where to?"),
            _turns(BODY.format("Rome", "open"), "Where to?"),
            _turns(BODY.format("Rome", "held"), "Where to?", "To Rome.", "Status?"),
            _turns(BODY.format("Oslo", "held"), "Where to?", "To Rome.", "Status?")]
    plans = [rewriters[i % 2].plan("tenant-a", *read_prompt(CHAT, body)) for i, body in enumerate(asks)]
    told = render_erratum("destination", "Oslo", "Rome")
    assert plans[1].context == [BODY.format("Oslo", "open") + told]
    assert plans[2].context == [BODY.format("Oslo", "open") + told, "Where to?",
                                "To Rome." + render_erratum("status", "open", "held")]
    assert plans[3].context[2].endswith(render_erratum("destination", "Rome", "Oslo"))
    hoisting = two("hoist")
    body = "record_id: SR-20417\ndeparture: {}\nstatus: open\n\n" + "\n".join(
        f"2026-03-01 log line {i} of the booking." for i in range(40))
    times = ["08:07", "09:07", "08:12", "09:12", "10:30", "08:07"]
    plans = [hoisting[i % 2].plan("tenant-a", *read_prompt(CHAT, _turns(body.format(t), "When?")))
             for i, t in enumerate(times)]
    assert [p.header for p in plans] == ["pass-through; reason=new base"] + ["hoist"] * 5
    assert [p.context[0].rstrip("\n").rsplit("\n", 1)[1] for p in plans[1:]] == [
        f"departure: {t}" for t in times[1:]]


def test_web_processes_under_serve_share_the_state(tmp_path, prefix):
    """Two web processes of `kvnotes serve` (two uvicorns here) given one KVNOTES_GATEWAY_STATE: the
    signed-in user's requests, alternating between them, start one base; both Gateway pages show the
    same numbers, and their /gateway/metrics sum to them."""
    from tests.conftest import ServedApp

    engine = Engine("vllm")
    env = {"KVNOTES_GATEWAY_UPSTREAM": f"{engine.url}/v1", "KVNOTES_GATEWAY_CHECK_RATE": "0",
           "KVNOTES_GATEWAY_STATE": f"{REDIS}#{prefix}",
           "KVNOTES_SECRET_KEY": SECRET_KEY}  # one deployment's: it seals the texts in Redis
    try:
        with ServedApp(tmp_path / "one", "tiny-llama", **env) as one, \
                ServedApp(tmp_path / "two", "tiny-llama", **env) as two:
            headers = []
            for i, city in enumerate(CITIES[:6]):
                app = (one, two)[i % 2]
                answer = httpx.post(f"{app.url}/gateway/v1/chat/completions", json=_chat(city), timeout=30)
                assert answer.status_code == 200, answer.text
                headers.append(answer.headers["x-kvnotes-gateway"])
                assert answer.headers["x-kvnotes-tenant"] == "user"
            assert headers == ["pass-through; reason=new base"] + ["erratum"] * 5
            seen = [_families(httpx.get(f"{app.url}/gateway/metrics").text) for app in (one, two)]
            assert sum(_value(families, "kvnotes_gateway_rewrites_total") for families in seen) == 5
            for app in (one, two):  # each process's counts reach the state at its next flush (0.5 s)
                assert _eventually(lambda url=app.url: "<td>6</td><td>5</td><td>1</td>"  # requests,
                                   in httpx.get(f"{url}/gateway/bases").text)  # rewrites, pass-throughs
    finally:
        engine.close()
