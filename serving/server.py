"""One OpenAI-compatible server (vLLM) as the replay sees it: which model it serves, how long a
prompt may be and whether the model has a chat template, token counts of a prompt, one streamed
completion timed to its first token, and the prefix-cache counters of `/metrics`.

A prompt is sent as kvnotes prefills it (`worker.engine.readout.Frame`): for a model with a chat
template, as the user message of that template (`/v1/chat/completions`, the server applies it); for
a model without one (a base model), as plain text ending in `PLAIN_TAIL` (`/v1/completions`).

Every failure becomes a `ReplayError` whose message names the server and what went wrong (the URL
unreachable, the model not served, a prompt too long, a request that died), never a traceback.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import httpx

from vocabulary.prompt import PLAIN_TAIL, choice_text


class ReplayError(Exception):
    """A replay that cannot run or did not finish, with a message for the user; `field` names what
    to change: "url" (the server), "model", "document" (a prompt too long) or the spec's field."""

    def __init__(self, message: str, field: str = "url") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ServerInfo:
    """The served model's name, its longest prompt + answer (`max_model_len`) and whether prompts
    go through its chat template."""

    model: str
    max_model_len: int
    chat: bool = True

    @property
    def prompt_format(self) -> str:
        return "chat" if self.chat else "plain"




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
    """An OpenAI-compatible server at `url` serving `model` (None: the one model it serves). `chat`:
    send prompts through the model's chat template (None: when it has one, which `info` finds out)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 600.0,
                 chat: bool | None = None):
        self.url = base_url(url)
        self.model = model
        self.chat = chat
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
        if self.chat is None:
            self.chat = self._has_chat_template()
        return ServerInfo(self.model, int(served[self.model].get("max_model_len") or 0), self.chat)

    def _has_chat_template(self) -> bool:
        """Whether the served model formats chat messages: vLLM's /tokenize refuses messages (HTTP
        400 naming the chat template) for a model without a template."""
        response = self._tokenize({"model": self.model, "messages": _messages("?"),
                                   "add_generation_prompt": True}, check=False)
        if response.status_code == 400 and "chat template" in response.text.lower():
            return False
        self._checked(response)
        return True

    def _prompt(self, content: str) -> dict:
        """The request body's prompt part for `content`, chat or plain."""
        if self.chat is False:
            return {"prompt": content + PLAIN_TAIL}
        return {"messages": _messages(content)}

    def _tokenize(self, body: dict, check: bool = True) -> httpx.Response:
        try:
            response = self._client.post("/tokenize", json=body)
        except NETWORK_ERRORS as exc:
            raise ReplayError(f"cannot reach the server at {self.url}: {_reason(exc)}") from None
        return self._checked(response) if check else response

    def _checked(self, response: httpx.Response) -> httpx.Response:
        if response.status_code != 200:
            raise ReplayError(f"{self.url}/tokenize answered HTTP {response.status_code} "
                              f"(the replay needs vLLM's /tokenize): {response.text[:200]}")
        return response

    def prompt_tokens(self, content: str) -> list[int]:
        """The token ids of the prompt that carries `content` (chat: as the user message)."""
        extra = {"add_generation_prompt": True} if self.chat is not False else {}
        response = self._tokenize({"model": self.model, **self._prompt(content), **extra})
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
        """Stream one greedy completion (chat or plain, as the model takes prompts), constrained to one
        of `choices` when there are any (vLLM's structured outputs: the decision over the choices, as
        kvnotes reads it); raises `ReplayError` when it fails or breaks off."""
        body = {"model": self.model, **self._prompt(content), "max_tokens": max_tokens,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        if choices:  # a base model's answer follows "Answer:" after a space, as Frame.choice_text writes it
            body["structured_outputs"] = {"choice": [choice_text(c, self.chat is not False) for c in choices]}
        path = "/v1/completions" if self.chat is False else "/v1/chat/completions"
        sent = time.perf_counter()
        first, parts, usage = None, [], None
        try:
            with self._client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    raise ReplayError(f"HTTP {response.status_code}: {response.read().decode()[:300]}")
                for chunk in _events(response):
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
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
