"""Running a replay: every variant's stream against one server, one variant after another, and what
it measured.

Per variant: the server's prefix cache emptied where it allows (`/reset_prefix_cache`, so no
earlier replay's prompts count as hits), the warm request (the prompt before the edits, unmeasured),
then the requests at their Poisson arrival times through a pool of `concurrency` connections (a
request that arrives while all are busy waits for one; its TTFT counts from when it is sent).
Measured per request: TTFT, prompt
tokens and the prefix-cache tokens the server reports (`usage.prompt_tokens_details.cached_tokens`);
the hit rate is cached / prompt tokens over the variant, checked against the change of vLLM's
`/metrics` counters across it. Before anything is sent, every prompt is tokenized by the server and
checked against its `max_model_len`: a replay that cannot fit fails before the first request.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from serving.server import Completion, ReplayError, ReplayStopped, Server, ServerInfo
from serving.session import Bounds, checked_lengths, delta, open_backend, warm_up
from serving.streams import PlannedRequest, plan_variant
from vocabulary.prefix import common_prefix
from vocabulary.replay import ReplayResult, ReplaySpec, TrajectoryReplaySpec, VariantResult
from vocabulary.verdicts import edit_followed

# on_progress(done, total, variant): requests finished so far over all variants.
Progress = Callable[[int, int, str], None]


def replay(spec: ReplaySpec, url: str, model: str | None = None, on_progress: Progress | None = None,
           bounds: Bounds | None = None, stop: threading.Event | None = None,
           engine: str = "vllm") -> ReplayResult:
    """Run every variant of `spec` against the server at `url`; a `ReplayError` naming the problem
    (and the request, when one failed) otherwise, `ReplayStopped` once `stop` is set or the replay
    runs past `bounds.replay_s`. Nothing is kept from a failed replay."""
    bounds = bounds or Bounds()
    with open_backend(url, model, bounds, stop, engine) as server:
        info, plans, lengths = _prepared(server, spec)
        total = spec.total_requests * len(plans)
        results = {}
        for variant, (warm, planned) in plans.items():
            done = len(results) * spec.total_requests
            progress = (lambda k, v=variant, d=done: on_progress(d + k, total, v)) if on_progress else None
            results[variant] = _run_variant(server, spec, warm, planned, lengths, progress)
        return ReplayResult(server.url, info.model, spec.rate, spec.concurrency, info.max_model_len,
                            round(os.getloadavg()[0], 2), results, info.prompt_format)


def preflight(spec: ReplaySpec | TrajectoryReplaySpec, url: str, model: str | None = None,
              bounds: Bounds = Bounds(connect_s=2.0, request_s=3.0, replay_s=5.0)) -> ServerInfo:
    """What a replay (of an edit or of a trajectory) can check on a web request, within seconds
    (`bounds`): the spec, the server reachable and serving the model. The prompts' lengths are
    checked by `replay` on the worker. A `ReplayError` naming the problem, else what the server
    serves."""
    problems = spec.problems()
    if problems:
        raise ReplayError("; ".join(problems), problems[0].split(":")[0].split(" ")[0])
    with open_backend(url, model, bounds) as server:
        return server.info()


def _prepared(server: Server, spec: ReplaySpec) -> tuple[ServerInfo, dict, dict[str, list[int]]]:
    problems = spec.problems()
    if problems:
        raise ReplayError("; ".join(problems), problems[0].split(":")[0].split(" ")[0])
    info = server.info()
    plans = {v: plan_variant(spec, v) for v in spec.variants}
    return info, plans, _checked_lengths(server, spec, plans, info.max_model_len)


def _checked_lengths(server: Server, spec: ReplaySpec, plans: dict,
                     max_model_len: int) -> dict[str, list[int]]:
    """Every prompt's token ids (warm prompts too), after checking each fits the server."""
    prompts = [(variant, what, content) for variant, (warm, planned) in plans.items()
               for what, content in [("warm-up", warm)] + [(f"request {r.index + 1}", r.content)
                                                           for r in planned]]
    return checked_lengths(server, prompts, spec.max_tokens, max_model_len, "the document", "document")


def _run_variant(server: Server, spec: ReplaySpec, warm: str, planned: list[PlannedRequest],
                 ids: dict[str, list[int]], progress: Callable[[int], None] | None) -> VariantResult:
    cache_reset, before = warm_up(server, planned[0].variant, warm, spec.max_tokens, spec.choices)
    started = time.perf_counter()
    completions = _stream_all(server, spec, planned, progress)
    elapsed = time.perf_counter() - started
    after = server.counters()
    result = _summarise(spec, planned, completions, elapsed, delta(before, after), ids[warm], ids)
    result.cache_reset = cache_reset
    return result


def _stream_all(server: Server, spec: ReplaySpec, planned: list[PlannedRequest],
                progress: Callable[[int], None] | None) -> list[Completion]:
    """Send each request at its arrival time through `concurrency` workers; the first failure stops
    the replay and names its request. An exception from `progress` (the caller cancelling) stops it
    too: no request is sent after it, and those waiting for a connection are dropped."""
    futures: list[Future] = []
    finished, lock = [0], threading.Lock()

    def one(request: PlannedRequest) -> Completion:
        completion = server.complete(request.content, spec.max_tokens, spec.choices)
        with lock:
            finished[0] += 1
            if progress:
                progress(finished[0])
        return completion

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=spec.concurrency, thread_name_prefix="replay") as pool:
        try:
            for request in planned:
                _raise_first_failure(futures, planned)
                server.pause(request.arrival_s - (time.perf_counter() - start))
                futures.append(pool.submit(one, request))
            for i, future in enumerate(futures):
                _result(future, planned[i])
        except BaseException:  # a failed request, or the caller's progress stopping the replay
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [future.result() for future in futures]


def _raise_first_failure(futures: list[Future], planned: list[PlannedRequest]) -> None:
    for i, future in enumerate(futures):
        if future.done():
            _result(future, planned[i])


def _result(future: Future, request: PlannedRequest) -> Completion:
    try:
        return future.result()
    except ReplayStopped:
        raise
    except ReplayError as exc:
        raise ReplayError(f"{request.variant} request {request.index + 1} (field = {request.value!r}) "
                          f"failed: {exc}") from None


def _summarise(spec: ReplaySpec, planned: list[PlannedRequest], completions: list[Completion],
               elapsed_s: float, metrics_rate: float | None, warm_ids: list[int],
               ids: dict[str, list[int]]) -> VariantResult:
    ttfts = [c.ttft_ms for c in completions]
    prompt = sum(c.prompt_tokens for c in completions)
    cached = sum(c.cached_tokens for c in completions)
    answers = [c.text for c in completions]
    followed = [_follows(spec, r.value, a) for r, a in zip(planned, answers)]
    shares = [common_prefix(warm_ids, ids[r.content]) / max(1, len(ids[r.content])) for r in planned]
    return VariantResult(
        requests=len(completions), prefix_hit_rate=round(cached / max(1, prompt), 4),
        ttft_p50_ms=round(percentile(ttfts, 50), 1), ttft_p90_ms=round(percentile(ttfts, 90), 1),
        throughput_rps=round(len(completions) / elapsed_s, 4), prompt_tokens=round(prompt / len(completions)),
        agreement=round(sum(followed) / len(followed), 4), cached_tokens=cached,
        metrics_hit_rate=None if metrics_rate is None else round(metrics_rate, 4),
        estimated_prefix_share=round(statistics.fmean(shares), 4),
        ttft_ms=[round(t, 1) for t in ttfts],
        hit_rates=[round(c.cached_tokens / max(1, c.prompt_tokens), 4) for c in completions],
        answers=answers, values=[r.value for r in planned])


def _follows(spec: ReplaySpec, value: str, answer: str) -> bool:
    """The answer names the field's current value and no other (the run page's `edit_followed`)."""
    others = [v for v in dict.fromkeys((spec.old_value, *spec.values)) if v != value]
    return edit_followed(answer, others, [value], spec.choices) == "new"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (a single value is every percentile)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]
