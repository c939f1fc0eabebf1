"""What an exact-prefix serving cache (vLLM's, SGLang's) can reuse of a prompt it has already seen:
the tokens the two prompts share from the start. The engine's `prefix_cache_share` and the serving
replay's own estimate count it the same way.

And the one block chain both prefix-keyed caches of ours hash (the KV store's block keys, the
gateway's reading of vLLM's KV events): `hash_parts` of the parts each with its length, SHA-256, and
`next_block`, a block's key chained from the one before."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def hash_parts(*parts: bytes) -> str:
    """SHA-256 of the parts, each preceded by its length (so no two lists of parts collide)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def ids_bytes(ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(ids)}q", *ids)


def next_block(prev: str, ids: Sequence[int]) -> str:
    """The key of the block of token `ids` that follows the block (or chain root) keyed `prev`."""
    return hash_parts(b"block", prev.encode(), ids_bytes(ids))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
