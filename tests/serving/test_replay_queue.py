"""Issue 52 on the real vLLM server (the session's `scripts/vllm.sh`, smollm2-135m on the CPU): an
answer queued behind other requests' prefills waits for its first token as long as the server works,
however long that is beside the replay's bound. On 2 busy cores each ~2,700-token prefill of the
consignment record is one engine step of about 10 s (load 18), and nothing in `/metrics` moves
during it; between steps the prompt-token, step and lookup counters do. The bound is set from a
measured prefill (3 of them, so a step never looks like a hang), and enough in-place prefills are
queued at once that the last one's first token comes after it. Before the fix the replay failed on
the first answer past the bound."""

from __future__ import annotations

import pytest

from serving import Bounds, ReplaySpec, replay
from serving.backend import connect
from tests.serving.conftest import CONSIGNMENT as RECORD
from tests.serving.conftest import CONSIGNMENT_QUESTION as QUESTION

pytestmark = pytest.mark.slow
START = RECORD.index("Tromso")
VALUES = ("Valencia", "Porto", "Gdansk", "Antwerp", "Napoli", "Bergen")


def test_in_place_prefills_queued_past_the_bound_all_answer(vllm_url):
    with connect(vllm_url) as server:
        server.info()
        assert server.reset_cache()  # a prefill measured from the cache would set a bound of nothing
        server.complete(RECORD + "\n\n" + QUESTION, 4)  # the first request of a server is slower
        one = server.complete(RECORD.replace("Tromso", "Lima") + "\n\n" + QUESTION, 4)
        assert one.cached_tokens < 128, one  # a whole prefill (the field is in the first block)
        one_s = one.ttft_ms / 1000
    bound_s = round(3 * one_s, 1)
    spec = ReplaySpec(RECORD, START, START + 6, "destination", VALUES, QUESTION, (), rate=1000.0,
                      concurrency=len(VALUES), variants=("in_place",), max_tokens=4)
    result = replay(spec, vllm_url, bounds=Bounds(request_s=bound_s))
    v = result.variants["in_place"]
    print(f"\none prefill {one_s:.1f} s, bound {bound_s:g} s; {len(VALUES)} queued at once: "
          f"TTFTs {v.ttft_ms} ms (load {result.load_average})")
    assert v.requests == len(VALUES) and len(v.answers) == len(VALUES)
    assert max(v.ttft_ms) > bound_s * 1000, v.ttft_ms  # one waited past the bound for its first token
    assert v.prefix_hit_rate <= 0.2  # each was a full prefill: the field is near the top
