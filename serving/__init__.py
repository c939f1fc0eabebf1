"""The serving replay: the same field edits sent to a real OpenAI-compatible server (vLLM) as
in-place rewrites, errata and hoisted fields, with the server's own prefix-cache hits, TTFT and
throughput measured per variant.

kvnotes drives the user's serving engine; it never re-implements one. Torch-free (httpx and the
shared vocabulary only), so the web app, the worker and the command line call the same code:

    from serving import ReplaySpec, replay
    result = replay(ReplaySpec(document, start, end, "destination", ("Madrid", "Rome"), question),
                    url="http://127.0.0.1:8100/v1", model="smollm2-135m")
    result.to_dict()  # {"variants": {"in_place": {...}, "erratum": {...}, "hoist": {...}}, ...}
"""

from serving.replay import Bounds, preflight, replay
from serving.server import ReplayError, ReplayStopped, Server, ServerInfo
from serving.streams import PlannedRequest, arrivals, plan_variant
from vocabulary.replay import VARIANTS, ReplayResult, ReplaySpec, VariantResult

__all__ = ["VARIANTS", "Bounds", "PlannedRequest", "ReplayError", "ReplayResult", "ReplaySpec",
           "ReplayStopped",
           "Server", "ServerInfo", "VariantResult", "arrivals", "plan_variant", "preflight", "replay"]
