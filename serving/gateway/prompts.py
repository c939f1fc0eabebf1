"""A client's OpenAI request as the gateway reads it: the context (what may be rewritten) and the
last message (never rewritten), and the request rebuilt around a rewritten context.

- `/v1/chat/completions`: the context is every message before the last; each must be text content
  (a string). The last message is sent as it came.
- `/v1/completions`: one prompt string; its context is everything before its last paragraph (the
  text after the last blank line, which holds the question and the answer cue), sent as it came.

Anything else (several prompts, token-id prompts, content parts such as images, no context) is not
read: the request passes through.
"""

from __future__ import annotations

from dataclasses import dataclass

CHAT = "/chat/completions"
COMPLETIONS = "/completions"


@dataclass(frozen=True)
class Prompt:
    """The rewritable part of a request: `context` (one text per message before the last; for a
    completion, one text), the `roles` of those messages, and what follows them, unchanged."""

    route: str
    model: str
    context: tuple[str, ...]
    roles: tuple[str, ...]
    last: str

    @property
    def size(self) -> int:
        """The context's characters."""
        return sum(len(text) for text in self.context)


def read_prompt(route: str, body: dict) -> tuple[Prompt | None, str]:
    """The request's prompt, or None and why it passes through."""
    model = str(body.get("model") or "")
    if route == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or len(messages) < 2:
            return None, "no context before the last message"
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            return None, "a message is not plain text"
        context = tuple(m["content"] for m in messages[:-1])
        roles = tuple(str(m.get("role")) for m in messages[:-1])
        return Prompt(route, model, context, roles, ""), ""
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        return None, "the prompt is not one text"
    cut = prompt.rfind("\n\n")
    if cut <= 0:
        return None, "no context before the prompt's last paragraph"
    return Prompt(route, model, (prompt[:cut],), ("prompt",), prompt[cut:]), ""


def with_context(body: dict, prompt: Prompt, context: list[str]) -> dict:
    """`body` with its context replaced by `context` (one text per context message)."""
    if prompt.route == CHAT:
        messages = [dict(m) for m in body["messages"]]
        for i, text in enumerate(context):
            messages[i]["content"] = text
        return {**body, "messages": messages}
    return {**body, "prompt": context[0] + prompt.last}
