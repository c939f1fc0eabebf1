"""No prompt in the clear at rest (issue 48 item 4): the texts the gateway keeps in Redis are sealed
(`serving.gateway.sealing`, AES-GCM under a key derived from the gateway's secret). Before, a
Redis dump held the prompts: 4 values held the test prompt's secret."""

from __future__ import annotations

import httpx
import pytest
import redis

from serving.gateway.sealing import GatewaySecret, Unsealable
from serving.gateway.tenants import add_key
from tests.serving.engines import Engine, Gateway

REDIS = "redis://127.0.0.1:6379/0"
LOG = "\n".join(f"2026-03-01 08:{i:02d} The carrier confirmed step {i} of the booking." for i in range(30))
# the secret is in the changed line's label too (the text before its colon), and in the value
SYSTEM = "You are the account agent.\nowner ZQXALPHA93817 status: {}\nplan: business\n\n" + LOG
VALUES = ["active", "suspended", "ZQXBRAVO55102", "closed"]



def _dump(prefix: str) -> dict[str, list[bytes]]:
    """Every value under `prefix`, whatever its type: {key: [its members, fields and values]}."""
    client = redis.Redis.from_url(REDIS)
    out: dict[str, list[bytes]] = {}
    try:
        for key in client.scan_iter(f"{prefix}*"):
            kind = client.type(key).decode()
            if kind == "string":
                values = [client.get(key) or b""]
            elif kind == "hash":
                values = [x for kv in client.hgetall(key).items() for x in kv]
            elif kind == "zset":
                values = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
            elif kind == "list":
                values = client.lrange(key, 0, -1)
            elif kind == "set":
                values = list(client.smembers(key))
            else:
                values = []
            out[key.decode()] = [key, *values]
    finally:
        client.close()
    return out


def test_no_redis_value_holds_prompt_text(tmp_path, prefix):
    engine = Engine("vllm", key="status")
    keys = tmp_path / "keys"
    key = add_key(keys, "alice")
    gateway = Gateway(tmp_path / "g", f"{engine.url}/v1", "--check-rate", "1", "--keys", str(keys),
                      "--state", f"{REDIS}#{prefix}")
    try:
        headers = []
        for value in VALUES:
            answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30, headers={
                "Authorization": f"Bearer {key}"}, json={
                "model": "smollm2-135m", "max_tokens": 8, "temperature": 0, "messages": [
                    {"role": "system", "content": SYSTEM.format(value)},
                    {"role": "user", "content": "What is the status?"}]})
            assert answer.status_code == 200, answer.text
            headers.append(answer.headers["x-kvnotes-gateway"])
        assert headers == ["pass-through; reason=new base"] + ["erratum"] * 3
        assert gateway.eventually("kvnotes_gateway_check_requests_total", 3)
    finally:
        gateway.stop()
        engine.close()
    dump = _dump(prefix)
    values = [v for held in dump.values() for v in held]
    sealed = [v for v in values if v.startswith(b"v1.")]
    assert len(sealed) >= 3, dump  # the base's texts, its errata state, its fields' labels: there, sealed
    for needle in (b"ZQXALPHA93817", b"ZQXBRAVO55102", b"suspended", b"The carrier confirmed",
                   b"account agent"):
        assert not [v for v in values if needle in v], needle
    assert "ZQXALPHA93817" not in gateway.log.read_text()  # nor in the log


def test_sealing_and_salts():
    one, other = GatewaySecret("a" * 20 + "secret-one-8f2k1"), GatewaySecret("b" * 20 + "secret-two-93kq0")
    sealed = one.sealer.seal("owner ZQXALPHA93817", "k:b:t/1")
    assert "ZQXALPHA93817" not in sealed and one.sealer.open(sealed, "k:b:t/1") == "owner ZQXALPHA93817"
    assert one.sealer.seal("same", "k") != one.sealer.seal("same", "k")  # a random nonce per value
    for sealer, name, value in ((other.sealer, "k:b:t/1", sealed), (one.sealer, "k:b:u/1", sealed),
                                (one.sealer, "k:b:t/1", sealed[:-4] + "AAAA"), (one.sealer, "k", "plain")):
        with pytest.raises(Unsealable):
            sealer.open(value, name)  # another secret, another place, altered, never sealed
    salts = {one.salt("tenant:a"), one.salt("tenant:b"), other.salt("tenant:a")}
    assert len(salts) == 3 and one.salt("tenant:a") == one.salt("tenant:a")
    assert all(len(s) == 64 and not set(s) & set("@/\\\x00") for s in salts)  # as vLLM takes a salt
