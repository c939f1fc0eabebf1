"""`kvnotes gateway` as a real process in front of a real HTTP peer speaking vLLM's API
(`tests.serving.engines.Engine`, deterministic, with an exact prefix cache), driven by the official
`openai` client: streamed and not, the rewrite header, `data: [DONE]`, `/metrics`, the sampled check
that switches a base to pass-through, and the faults (upstream down, slow, 5xx; 413; bad JSON and
bad Unicode; a client that goes away mid-stream). The real vLLM server's side is
`test_gateway_vllm.py`; template mode under `kvnotes serve` is `test_gateway_serve.py`."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import REPO, free_port, kvnotes_env
from tests.serving.engines import Engine, Gateway
from vocabulary import render_erratum

# an agent's system prompt: its destination near the top, then ~1,500 characters that never change
LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))
SYSTEM = "You are the shipping agent.\nrecord_id: SR-20417\ndestination: {}\ncarrier: NordFreight\n\n" + LOG
ASK = "What is the destination of this shipment?"
CITIES = ["Oslo", "Madrid", "Rome", "Lisbon", "Paris"]


@pytest.fixture
def engine():
    served = Engine("vllm")
    yield served
    served.close()


def ask(client: openai.OpenAI, city: str, stream: bool = False, **kw):
    messages = [{"role": "system", "content": SYSTEM.format(city)}, {"role": "user", "content": ASK}]
    if not stream:
        return client.chat.completions.with_raw_response.create(model="smollm2-135m", messages=messages,
                                                                 max_tokens=8, temperature=0, **kw)
    return client.chat.completions.with_raw_response.create(model="smollm2-135m", messages=messages,
                                                             max_tokens=8, temperature=0, stream=True, **kw)


def test_the_openai_client_through_the_gateway_streamed_and_not(tmp_path, engine):
    gateway = Gateway(tmp_path, f"{engine.url}/v1", "--check-rate", "0")
    try:
        client = gateway.client()
        assert [m.id for m in client.models.list()] == ["smollm2-135m"]
        first = ask(client, "Oslo")
        assert first.headers["x-kvnotes-gateway"] == "pass-through; reason=new base"
        assert first.parse().choices[0].message.content == "The destination is Oslo."
        answers, headers = [], []
        for city in CITIES[1:]:
            raw = ask(client, city, stream=True)
            headers.append(raw.headers["x-kvnotes-gateway"])
            answers.append("".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices))
        assert headers == ["erratum"] * 4
        assert answers == [f"The destination is {c}." for c in CITIES[1:]]  # the engine reads the erratum
        # what the engine received: the base unchanged, then one erratum from the base's value to
        # the current one (the same turn asked again: the edit replay's erratum layout)
        sent = [b["messages"][0]["content"] for b in engine.completions]
        base = SYSTEM.format("Oslo")
        assert sent[1:] == [base + render_erratum("destination", "Oslo", c) for c in CITIES[1:]]
        assert engine.completions[-1]["messages"][1]["content"] == ASK  # the last message never changes
        assert gateway.metric("kvnotes_gateway_rewrites_total") == 4
        assert gateway.metric("kvnotes_gateway_pass_through_total", reason="new_base") == 1
        # the four rewrites reused the base's prefix and the errata before theirs (the first: a miss)
        reused = gateway.metric("kvnotes_gateway_prefix_tokens_reused_total")
        first = len(engine.render(engine.completions[0]))
        rewritten = gateway.metric("kvnotes_gateway_prompt_tokens_total") - first
        assert reused / rewritten > 0.9
        assert gateway.eventually("kvnotes_gateway_ttft_seconds_count", 4, sent="rewritten")
        raw = httpx.post(f"{gateway.url}/v1/chat/completions", json={
            "model": "smollm2-135m", "stream": True, "max_tokens": 8,
            "messages": [{"role": "system", "content": SYSTEM.format("Oslo")},
                         {"role": "user", "content": ASK}]})
        assert raw.text.rstrip().endswith("data: [DONE]")
        assert '"usage"' not in raw.text  # the client did not ask for it: the gateway's own is kept back
    finally:
        gateway.stop()


def test_a_stream_is_counted_when_its_client_closes_right_after_done(tmp_path):
    """The upstream keeps its stream open 60 s after `data: [DONE]`; the client closes as soon as it
    has read it (as the `openai` client may): the request is counted all the same (a CI run's gateway
    counted 3 of 4 streamed rewrites when the client's close came before the upstream's end)."""
    engine = Engine("vllm", fault="linger", delay_s=60)
    gateway = Gateway(tmp_path, f"{engine.url}/v1", "--check-rate", "0")
    try:
        for city in CITIES[:2]:
            body = {"model": "smollm2-135m", "stream": True, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "system", "content": SYSTEM.format(city)},
                                 {"role": "user", "content": ASK}]}
            with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                              headers={"Authorization": "Bearer sk-test"}) as raw:
                lines = []
                for line in raw.iter_lines():
                    lines.append(line)
                    if line == "data: [DONE]":
                        break
            assert any(f"{city}." in line for line in lines)
        assert gateway.eventually("kvnotes_gateway_ttft_seconds_count", 1, sent="pass_through")
        assert gateway.eventually("kvnotes_gateway_ttft_seconds_count", 1, sent="rewritten")
        assert gateway.metric("kvnotes_gateway_rewrites_total") == 1
    finally:
        gateway.stop()
        engine.close()


def test_a_sampled_check_that_disagrees_switches_the_base_to_pass_through(tmp_path):
    """An engine that ignores errata (it reads the first value written): the rewritten answer names the
    old city, the unchanged one the new: the check disagrees, the base's lower bound falls under the
    threshold, and the next requests of that base pass through, saying why."""
    engine = Engine("vllm", reads="first")
    gateway = Gateway(tmp_path, f"{engine.url}/v1", "--check-rate", "1")
    try:
        client = gateway.client()
        assert ask(client, "Oslo").headers["x-kvnotes-gateway"] == "pass-through; reason=new base"
        rewritten = ask(client, "Madrid")
        assert rewritten.headers["x-kvnotes-gateway"] == "erratum"
        assert rewritten.parse().choices[0].message.content == "The destination is Oslo."  # stale
        assert gateway.eventually("kvnotes_gateway_switched_total", 1)
        after = ask(client, "Rome")
        assert after.headers["x-kvnotes-gateway"] == ("pass-through; reason=sampled agreement 0/1, lower "
                                                       "bound 0.00 under 0.9")
        assert after.parse().choices[0].message.content == "The destination is Rome."
        assert gateway.metric("kvnotes_gateway_checks_total", agreed="false") == 1
        # what the check cost: its prompt, as the engine counted it, beside the clients' three
        prompts = [len(engine.render(body)) for body in engine.completions]
        assert gateway.metric("kvnotes_gateway_check_requests_total") == 1
        assert gateway.metric("kvnotes_gateway_check_prompt_tokens_total") == prompts[2]  # Madrid, unchanged
        assert gateway.metric("kvnotes_gateway_prompt_tokens_total") == prompts[0] + prompts[1] + prompts[3]
        assert "gateway base switched to pass-through" in gateway.log.read_text()
        assert "destination: Madrid" not in gateway.log.read_text()  # prompts are never logged
    finally:
        gateway.stop()
        engine.close()


def test_faults_come_back_as_openai_errors(tmp_path):
    down = free_port()
    failing = Engine("vllm", fault="500")
    slow = Engine("vllm", fault="slow", delay_s=6)
    gateways = [Gateway(tmp_path / name, url, "--timeout", "2", "--max-body", "20000", wait=False)
                for name, url in (("down", f"http://127.0.0.1:{down}/v1"), ("failing", failing.url),
                                  ("slow", slow.url))]
    try:
        for gateway in gateways:
            gateway.ready()
        for gateway, status, says in zip(gateways, (502, 500, 504), ("could not be reached",
                                                                    "answered HTTP 500: engine fault",
                                                                    "did not answer within 2 s")):
            with pytest.raises(openai.APIStatusError) as caught:
                gateway.client().chat.completions.create(model="smollm2-135m", max_tokens=4, messages=[
                    {"role": "system", "content": SYSTEM.format("Oslo")}, {"role": "user", "content": ASK}])
            assert caught.value.status_code == status
            assert says in caught.value.body["message"]
        gateway = gateways[1]
        big = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{" + b" " * 30000 + b"}",
                         headers={"content-type": "application/json"})
        assert big.status_code == 413
        assert "over the gateway's limit of 20000" in big.json()["error"]["message"]
        broken = httpx.post(f"{gateway.url}/v1/chat/completions", content=b'{"model": ',
                            headers={"content-type": "application/json"})
        assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
        lone = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800"}]}'
        surrogate = httpx.post(f"{gateway.url}/v1/chat/completions", content=lone,
                               headers={"content-type": "application/json"})
        assert surrogate.status_code == 400
        assert surrogate.json()["error"] == {
            "message": "messages[0].content is not valid Unicode: a lone surrogate U+D800 at character 1 "
                       "(send text as UTF-8)", "type": "invalid_request_error",
            "param": "messages[0].content", "code": 400}
        no_messages = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": "m"})
        assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"
        assert failing.completions and not slow.gone.is_set()
    finally:
        for gateway in gateways:
            gateway.stop()
        failing.close()
        slow.close()


def test_a_client_that_goes_away_mid_stream_cancels_the_upstream_request(tmp_path):
    trickle = Engine("vllm", fault="trickle", delay_s=0.2)
    gateway = Gateway(tmp_path, trickle.url, "--timeout", "60")
    try:
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json={
                "model": "smollm2-135m", "stream": True, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}]}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
        assert trickle.gone.wait(15), "the upstream went on streaming to nobody"
    finally:
        gateway.stop()
        trickle.close()


@pytest.mark.parametrize(("options", "says"), [
    (["--upstream", "http://127.0.0.1:5432/v1"], "kvnotes: --upstream: port 5432 is a database's"),
    (["--upstream", "http://127.0.0.1:8100/v1", "--check-rate", "2"],
     "--check-rate: must be between 0 and 1"),
    (["--upstream", "http://127.0.0.1:8100/v1", "--state", "mysql://db/1"],
     "--state: give redis://HOST:PORT/DB, not 'mysql://db/1'"),
    (["--upstream", "http://127.0.0.1:8100/v1", "--upstream", "http://127.0.0.1:8101/v1",
      "--kv-events", "tcp://127.0.0.1:5557"],
     "--kv-events: 1 given for 2 upstreams; give one endpoint per --upstream, in the same order"),
    (["--upstream", "http://127.0.0.1:8100/v1", "--kv-events", "http://127.0.0.1:5557"],
     "--kv-events: give tcp://HOST:PORT, not 'http://127.0.0.1:5557'"),
    (["--upstream", "http://127.0.0.1:8100/v1", "--upstream", "http://127.0.0.1:8100/v1"],
     "--upstream: each upstream once"),
    (["--upstream", "http://127.0.0.1:8100/v1", "--route", "random"], "--route: invalid choice: 'random'"),
])
def test_bad_options_exit_2_naming_them(tmp_path, options, says):
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO), "KVNOTES_VLLM_URL": ""}
    done = subprocess.run([sys.executable, "-m", "commands.cli", "gateway", *options], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
