"""One OpenAI-compatible server (vLLM) as the replay sees it: which model it serves and how long a
prompt may be, token counts of a chat prompt, one streamed chat completion timed to its first
token, and the prefix-cache counters of `/metrics`.

Every failure becomes a `ReplayError` whose message names the server and what went wrong (the URL
unreachable, the model not served, a prompt too long, a request that died), never a traceback.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import httpx


class ReplayError(Exception):
    """A replay that cannot run or did not finish, with a message for the user; `field` names what
    to change: "url" (the server), "model", "document" (a prompt too long) or the spec's field."""

    def __init__(self, message: str, field: str = "url") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ServerInfo:
    """The served model's name and its longest prompt + answer (`max_model_len`)."""

    model: str
    max_model_len: int


@dataclass(frozen=True)
class Completion:
    """One streamed answer: time to its first token and to its end (from sending), its text, and the
    server's usage (prompt tokens and how many of them came from the prefix cache)."""

    ttft_ms: float
    latency_ms: float
    text: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Counters:
    """vLLM's cumulative prefix-cache counters, in tokens."""

    queries: float
    hits: float


# what a request to an address can raise besides an answer (an address httpx or IDNA refuses included)
NETWORK_ERRORS = (httpx.HTTPError, httpx.InvalidURL, UnicodeError, OSError)
_COUNTER = re.compile(r"^vllm:prefix_cache_(queries|hits)_total\{[^}]*\}\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


def base_url(url: str) -> str:
    """The server's root from what a user pastes: `http://h:p`, `http://h:p/v1` or with a slash."""
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ReplayError(f"server URL must start with http:// or https://, got {url!r}")
    try:
        httpx.URL(url).host.encode("idna")
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        raise ReplayError(f"server URL {url!r} is not a valid address: {exc}") from None
    return url[:-3] if url.endswith("/v1") else url


class Server:
    """An OpenAI-compatible server at `url` serving `model` (None: the one model it serves)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 600.0):
        self.url = base_url(url)
        self.model = model
        self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=10.0))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _get_json(self, path: str) -> dict:
        try:
            response = self._client.get(path)
        except NETWORK_ERRORS as exc:
            raise ReplayError(f"cannot reach the server at {self.url}: {_reason(exc)}") from None
        if response.status_code != 200:
            raise ReplayError(f"{self.url}{path} answered HTTP {response.status_code}: is this an "
                              f"OpenAI-compatible server (vLLM)? {response.text[:200]}")
        return _json(response, self.url + path)

    def info(self) -> ServerInfo:
        """The served model (checked against `model`) and its max_model_len."""
        cards = self._get_json("/v1/models").get("data") or []
        served = {card.get("id"): card for card in cards}
        if self.model is None:
            if len(served) != 1:
                raise ReplayError(f"{self.url} serves {len(served)} models ({', '.join(served) or 'none'}); "
                                  "name one with --model", "model")
            self.model = next(iter(served))
        if self.model not in served:
            raise ReplayError(f"model {self.model!r} is not served by {self.url}; it serves: "
                              f"{', '.join(served) or 'no model'}", "model")
        return ServerInfo(self.model, int(served[self.model].get("max_model_len") or 0))

    def prompt_tokens(self, content: str) -> list[int]:
        """The token ids of the chat prompt that carries `content` as the user message."""
        body = {"model": self.model, "messages": _messages(content), "add_generation_prompt": True}
        try:
            response = self._client.post("/tokenize", json=body)
        except NETWORK_ERRORS as exc:
            raise ReplayError(f"cannot reach the server at {self.url}: {_reason(exc)}") from None
        if response.status_code != 200:
            raise ReplayError(f"{self.url}/tokenize answered HTTP {response.status_code} "
                              f"(the replay needs vLLM's /tokenize): {response.text[:200]}")
        tokens = _json(response, f"{self.url}/tokenize").get("tokens")
        if not isinstance(tokens, list):
            raise ReplayError(f"{self.url}/tokenize answered without token ids (the replay needs vLLM)")
        return tokens

    def reset_cache(self) -> bool:
        """Empty the server's prefix cache (vLLM's development endpoint, which scripts/vllm.sh enables
        on a loopback bind); False when the server does not offer it."""
        try:
            response = self._client.post("/reset_prefix_cache")
        except NETWORK_ERRORS as exc:
            raise ReplayError(f"cannot reach the server at {self.url}: {_reason(exc)}") from None
        return response.status_code == 200

    def counters(self) -> Counters | None:
        """The prefix-cache counters summed over engines, or None when `/metrics` has none."""
        try:
            response = self._client.get("/metrics")
        except NETWORK_ERRORS as exc:
            raise ReplayError(f"cannot reach the server at {self.url}: {_reason(exc)}") from None
        found = {"queries": 0.0, "hits": 0.0}
        matches = _COUNTER.findall(response.text) if response.status_code == 200 else []
        for kind, value in matches:
            found[kind] += float(value)
        return Counters(found["queries"], found["hits"]) if matches else None

    def complete(self, content: str, max_tokens: int, choices: tuple[str, ...] = ()) -> Completion:
        """Stream one greedy chat completion, constrained to one of `choices` when there are any (vLLM's
        structured outputs: the decision over the choices, as kvnotes reads it); raises `ReplayError`
        when it fails or breaks off."""
        body = {"model": self.model, "messages": _messages(content), "max_tokens": max_tokens,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        if choices:
            body["structured_outputs"] = {"choice": list(choices)}
        sent = time.perf_counter()
        first, parts, usage = None, [], None
        try:
            with self._client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    raise ReplayError(f"HTTP {response.status_code}: {response.read().decode()[:300]}")
                for chunk in _events(response):
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content") or ""
                        if first is None and (text or choice.get("finish_reason")):
                            first = time.perf_counter()
                        parts.append(text)
        except NETWORK_ERRORS as exc:
            raise ReplayError(f"the server at {self.url} stopped answering: {_reason(exc)}") from None
        if first is None or usage is None:
            raise ReplayError("the stream ended before an answer and its usage arrived")
        done = time.perf_counter()
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        return Completion((first - sent) * 1000, (done - sent) * 1000, "".join(parts),
                          int(usage.get("prompt_tokens") or 0), int(cached))


def _json(response: httpx.Response, where: str) -> dict:
    try:
        data = response.json()
    except ValueError:
        raise ReplayError(f"{where} did not answer JSON: "
                          "is this an OpenAI-compatible server (vLLM)?") from None
    if not isinstance(data, dict):
        raise ReplayError(f"{where} answered {type(data).__name__}, not a JSON object")
    return data


def _messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _events(response: httpx.Response):
    """The JSON chunks of a server-sent event stream, up to `[DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ReplayError(f"the stream carried something that is not JSON: {data[:100]!r}") from None
        if "error" in chunk:
            raise ReplayError(f"the server reported an error mid-stream: {chunk['error']}")
        yield chunk


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
