"""What an exact-prefix serving cache (vLLM's, SGLang's) can reuse of a prompt it has already seen:
the tokens the two prompts share from the start. The engine's `prefix_cache_share` and the serving
replay's own estimate count it the same way."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
