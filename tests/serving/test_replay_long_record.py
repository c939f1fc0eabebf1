"""Issue 44 on the real vLLM server (the session's `scripts/vllm.sh`, smollm2-135m, --max-model-len
4096): `kvnotes replay` of a ~2,700-token record (the issue's header, then 170 short ledger lines)
with the issue's options (6 requests at 0.2/s, in_place then erratum, default concurrency 4) exits
0, and the erratum keeps the prefix cache while the in-place edit loses it."""

from __future__ import annotations

import json

import pytest

from serving.backend import connect
from tests.conftest import REPO, kvnotes_cli
from tests.serving.conftest import CONSIGNMENT as RECORD
from tests.serving.conftest import CONSIGNMENT_QUESTION as QUESTION

pytestmark = pytest.mark.slow



def test_the_issue_44_replay_of_a_2700_token_record_exits_0(vllm_url, tmp_path):
    with connect(vllm_url) as server:
        server.info()
        tokens = len(server.prompt_tokens(RECORD + QUESTION))
    assert 2500 <= tokens <= 2900, tokens  # the issue's ~2,700 tokens, well inside 4096 with the answer
    document = tmp_path / "doc.txt"
    document.write_text(RECORD)
    out = kvnotes_cli("replay", "--url", vllm_url, "--document", str(document), "--field", "Tromso",
                      "--values", "Valencia,Porto,Gdansk,Antwerp,Napoli,Bergen", "--question", QUESTION,
                      "--requests", "6", "--rate", "0.2", "--variants", "in_place,erratum", "--json",
                      env={"PATH": f"{REPO}/.venv/bin:/usr/bin:/bin"}, timeout=900)
    assert out.returncode == 0, out.stderr
    variants = json.loads(out.stdout)["variants"]
    assert list(variants) == ["in_place", "erratum"]
    for name, v in variants.items():
        assert v["requests"] == 6 and len(v["answers"]) == 6, name
        assert v["metrics_hit_rate"] == pytest.approx(v["prefix_hit_rate"], abs=0.005), name  # /metrics agree
        assert 2500 <= v["prompt_tokens"] <= 2950, (name, v["prompt_tokens"])
    assert variants["erratum"]["prefix_hit_rate"] >= 0.8, variants["erratum"]
    assert variants["in_place"]["prefix_hit_rate"] <= 0.2, variants["in_place"]
