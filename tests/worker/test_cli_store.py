"""`kvnotes edit --store URL` on two hosts (two data folders) and `kvnotes store` (issue 40), on the
run's SeaweedFS: the second host's edit reads the first host's notes from the shared tier, and
`kvnotes store` prints each tier's objects, bytes, hits and misses."""

from __future__ import annotations

import json

from tests.conftest import kvnotes_cli, kvnotes_env
from tests.s3 import REDIS_URL
from worker.engine.store_tiers import SharedIndex

DOC = "Account record.\nstatus: active\nowner: Ada\n" + "Only active accounts may log in. " * 8


def test_edit_with_a_store_on_two_hosts_and_the_store_command(tmp_path, s3_server) -> None:
    url = s3_server.store_url()
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    edit = ("edit", "--model", "tiny-llama", "--document", str(doc), "--replace", "active", "closed",
            "--question", "Can the user log in?", "--choices", "yes,no", "--strategies", "recompute,erratum",
            "--json", "--store", url)
    envs = {host: {**kvnotes_env(tmp_path / host), **s3_server.env, "KVNOTES_STORE_INDEX": REDIS_URL}
            for host in ("a", "b")}
    try:
        first = kvnotes_cli(*edit, env=envs["a"], timeout=300)
        assert first.returncode == 0, first.stderr
        second = kvnotes_cli(*edit, env=envs["b"], timeout=300)
        assert second.returncode == 0, second.stderr
        a, b = json.loads(first.stdout), json.loads(second.stdout)
        full = 64 * (a["document_tokens"] // 64)  # whole blocks of 64 tokens
        assert a["store_reuse"] == {"tokens": 0, "tier": "none"}
        assert b["store_reuse"] == {"tokens": full, "tier": "shared"} and full >= 0.8 * a["document_tokens"]
        assert {n: r["decision"] for n, r in a["strategies"].items()} == \
            {n: r["decision"] for n, r in b["strategies"].items()}

        shown = kvnotes_cli("store", "--store", url, "--json", env=envs["b"])
        assert shown.returncode == 0, shown.stderr
        local, shared = json.loads(shown.stdout)
        assert (local["tier"], local["objects"]) == ("local", full // 64)  # kept from the shared tier
        assert shared["tier"] == "shared" and shared["reachable"] == "yes"
        assert shared["objects"] == full // 64 + 1 and shared["hits"] == full // 64  # + A's manifest
        table = kvnotes_cli("store", "--store", url, env=envs["b"])
        assert table.returncode == 0 and table.stdout.splitlines()[2].startswith("shared")
    finally:
        SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()
