"""`kvnotes edit --store URL` on two hosts (two data folders) and `kvnotes store` (issue 40), on the
run's SeaweedFS: the second host's edit reads the first host's notes from the shared tier, and
`kvnotes store` prints each tier's objects, bytes, hits and misses (`--verify`: the bucket's own
count). With its index on a listener that accepts and never answers (issue 49), an edit of a
~1,500-token record finishes within 1.5x (+10 s) of the same edit with a working index, and decides
the same."""

from __future__ import annotations

import json
import os
import time

from tests.conftest import kvnotes_cli, kvnotes_env
from tests.s3 import REDIS_URL, silent_listener
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
        listed = kvnotes_cli("store", "--store", url, "--verify", "--json", env=envs["b"])
        verified = json.loads(listed.stdout)
        assert verified[1]["bucket_objects"] == shared["objects"] and verified[1]["bucket_bytes"] > 0
    finally:
        SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()


RECORD = ("Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
          + "Only accounts whose status is active may log in. " * 29)  # ~1,500 tokens


def test_a_hanging_index_does_not_stall_an_edit(tmp_path, s3_server) -> None:
    doc = tmp_path / "record.txt"
    doc.write_text(RECORD)

    def edit(host: str, index: str) -> tuple[dict, float]:
        url = s3_server.store_url()  # each edit an empty tier of its own: the same work
        env = {**kvnotes_env(tmp_path / host), **s3_server.env, "KVNOTES_STORE_INDEX": index}
        started = time.monotonic()
        done = kvnotes_cli("edit", "--model", "tiny-llama", "--document", str(doc), "--replace", "active",
                           "suspended", "--question", "Can Dana log in?", "--choices", "yes,no",
                           "--strategies", "recompute,erratum,in_place", "--json", "--store", url,
                           env=env, timeout=600)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        SharedIndex(REDIS_URL, url.removeprefix("s3://")).clear()
        return json.loads(done.stdout), took

    working, t_working = edit("working", REDIS_URL)
    with silent_listener() as port:
        hanging, t_hanging = edit("hanging", f"redis://127.0.0.1:{port}/0")
    print(f"edit with a working index {t_working:.1f} s, with a hanging one {t_hanging:.1f} s, load average "
          f"{os.getloadavg()[0]:.1f}")
    assert working["document_tokens"] >= 1400
    assert {n: r["decision"] for n, r in hanging["strategies"].items()} == \
        {n: r["decision"] for n, r in working["strategies"].items()}
    # relative to the same edit on the same machine just before, never an absolute time
    assert t_hanging <= 1.5 * t_working + 10, (t_hanging, t_working)
