"""The serving replay: the same field edits sent to a real OpenAI-compatible server (vLLM) as
in-place rewrites, errata and hoisted fields, with the server's own prefix-cache hits, TTFT and
throughput measured per variant.

kvnotes drives the user's serving engine; it never re-implements one. Torch-free (httpx and the
shared vocabulary only), so the web app, the worker and the command line call the same code:

    from serving import ReplaySpec, replay
    result = replay(ReplaySpec(document, start, end, "destination", ("Madrid", "Rome"), question),
                    url="http://127.0.0.1:8100/v1", model="smollm2-135m")
    result.to_dict()  # {"variants": {"in_place": {...}, "erratum": {...}, "hoist": {...}}, ...}

A trajectory (`vocabulary.trajectories`: turns appending text and changing fields) is replayed the
same way, one request per turn in order (`replay_trajectory`, `serving.trajectory`). Both speak to
the engine only through the serving backend protocol (`serving.backend`: vLLM and SGLang), as the
erratum gateway does.
"""

from serving.backend import ENGINES, Backend, SglangBackend, VllmBackend, connect
from serving.replay import preflight, replay
from serving.server import ReplayError, ReplayStopped, Server, ServerInfo
from serving.session import Bounds
from serving.streams import PlannedRequest, arrivals, plan_variant
from serving.trajectory import PlannedTurn, plan_turns, replay_trajectory
from vocabulary.replay import (
    VARIANTS,
    ReplayResult,
    ReplaySpec,
    TrajectoryReplayResult,
    TrajectoryReplaySpec,
    VariantResult,
)

__all__ = ["ENGINES", "VARIANTS", "Backend", "Bounds", "PlannedRequest", "PlannedTurn", "ReplayError",
           "ReplayResult", "ReplaySpec", "ReplayStopped", "Server", "ServerInfo", "SglangBackend",
           "TrajectoryReplayResult", "TrajectoryReplaySpec", "VariantResult", "VllmBackend", "arrivals",
           "connect", "plan_turns", "plan_variant", "preflight", "replay", "replay_trajectory"]
