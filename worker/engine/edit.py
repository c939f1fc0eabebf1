"""Edit: changing fields of a document whose notes are already cached — every strategy of the paper.

The old notes hold the tokens of the old text; the new text tokenizes to `new_ids`. A token-level
diff (difflib, no junk heuristic) splits the new sequence into blocks equal to old tokens and
changed blocks (the fields, plus any token whose boundaries moved). Each strategy decides what to
recompute (each in its own file under `worker/engine/strategies/edits/`, built from the surgery
here):

| strategy        | recomputed                                                     |
| recompute       | every token (the oracle)                                       |
| prefix_reuse    | every token from the first change on (exact, a serving engine's prefix cache) |
| stale           | nothing                                                        |
| in_place        | the changed blocks; equal blocks keep their K/V, keys re-rotated by the length change Δ |
| erratum         | an appended correction only                                    |
| field_erratum   | in_place + the appended correction                             |
| selective       | in_place + top fraction of downstream tokens whose notes moved most (CacheBlend-like) |

`selective` ranks downstream tokens by CacheBlend's rule (`worker.engine.selective`): decoder layer 0
is re-run over the tokens after the first change, each reused token is scored by how far its layer-1
K/V moved, and the top fraction is recomputed in ALL layers — never a full recompute to find them.

`in_place`, `field_erratum` and `selective` can leave the tokens they recompute to the readout
(`defer=True`, what `run` asks for): their notes then hold zeros or stale K/V at those positions,
`Surgery.deferred` names them, and the readout computes them in the same forward as the question,
under a mask that gives every row exactly what it would have seen had they been computed first
(`worker.engine.forward.Deferred`). On a CPU a forward costs a fixed pass over the weights whatever
its length (about 155 ms for smollm2-135m on our 2-core VMs), so this removes one such pass.
Sliding-window models compute first (one custom mask cannot carry their windows).
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher

from vocabulary import ERRATUM
from vocabulary.prefix import common_prefix
from worker.engine.forward import CHUNK_TOKENS, Deferred, cut, extend, fill, join_all
from worker.engine.notes import KV, Notes
from worker.engine.rope import RopeLayout, shift_keys
from worker.engine.selective import has_sliding_window
from worker.engine.split_attention import joins, splits_on_this_device


@dataclass
class Surgery:
    """A strategy's cache: per-layer K/V for `token_ids` minus the trailing `pending` tokens, which
    the strategy appends and the readout computes in the same forward as the question (an erratum).
    With `deferred`, the K/V at those positions are not computed yet either: the readout computes
    them in that same forward, and `completed` writes them in. `tokens_computed` counts every token
    the strategy runs through the model, pending and deferred ones included."""

    layers: list[KV]
    token_ids: list[int]
    segments: list[str]
    offsets: list[tuple[int, int]]
    tokens_computed: int
    detail: str = ""
    pending: list[int] = field(default_factory=list)
    deferred: Deferred | None = None

    def completed(self, deferred_kv: list[KV] | None) -> Surgery:
        """This surgery with the deferred K/V (from the readout that computed them) written into its
        notes (in place: a deferring strategy's notes are its own copy)."""
        if self.deferred is None:
            return self
        if deferred_kv is None:
            raise ValueError("a surgery with deferred tokens needs the readout's K/V for them")
        return replace(self, layers=fill(self.layers, self.deferred, deferred_kv), deferred=None)


def shift(layers: list[KV], rope: RopeLayout | None, delta: int) -> list[KV]:
    if delta == 0:
        return layers
    if rope is None:
        from worker.engine.rope import NotPortableError

        raise NotPortableError("this model's keys cannot be re-rotated, so an edit may not change the length")
    return [(shift_keys(k, rope.layers[i], delta), v) for i, (k, v) in enumerate(layers)]


@dataclass(frozen=True)
class Block:
    """A run of new tokens [j1, j2): `reuse` = equal to old tokens [i1, i1 + j2 - j1)."""

    j1: int
    j2: int
    reuse: bool
    i1: int = -1


def diff_blocks(old_ids: list[int], new_ids: list[int]) -> list[Block]:
    matcher = SequenceMatcher(a=old_ids, b=new_ids, autojunk=False)
    blocks = []
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if j2 == j1:
            continue  # pure deletion: nothing of it survives in the new sequence
        blocks.append(Block(j1, j2, tag == "equal", i1 if tag == "equal" else -1))
    return blocks


class Editor:
    """One (old notes → new tokens) change, and the surgery every edit strategy is made of: the
    diff's blocks, reused blocks re-rotated, placeholders, deferring, appending. The strategies
    themselves (what each recomputes) are in `worker.engine.strategies.edits`, one file each."""

    def __init__(self, model, rope: RopeLayout | None, old: Notes, new_ids: list[int],
                 new_segments: list[str], new_offsets: list[tuple[int, int]]):
        self.model, self.rope, self.old = model, rope, old
        self.new_ids, self.new_segments, self.new_offsets = new_ids, new_segments, new_offsets
        self.blocks = diff_blocks(old.token_ids, new_ids)
        self._from_change: Surgery | None = None
        self.defers = True  # a strategy may leave the tokens it computes to the readout

    def eager(self) -> Editor:
        """This change, with every token a strategy computes computed by its surgery itself (nothing
        deferred): the notes an analysis reads, or a cache carried forward, must be complete."""
        twin = copy(self)
        twin.defers = False
        return twin

    def surgery(self, layers: list[KV], computed: int, detail: str = "") -> Surgery:
        """`layers` as the notes of the new tokens."""
        return Surgery(layers, list(self.new_ids), list(self.new_segments), list(self.new_offsets),
                       computed, detail)

    def from_first_change(self) -> Surgery:
        """The exact notes of the new tokens: the old notes up to the first change kept (the same
        cache: equal tokens at equal positions), every token from there on computed again. Computed
        once per editor; `tokens_computed` is what it ran (prefix_reuse's cost)."""
        if self._from_change is None:
            p = min(common_prefix(self.old.token_ids, self.new_ids), len(self.new_ids))
            layers = extend(self.model, cut(self.old.layers, 0, p), self.new_ids[p:])
            self._from_change = self.surgery(layers, len(self.new_ids) - p)
        return self._from_change

    def exact_from(self, start: int) -> list[KV] | None:
        """The exact notes (`from_first_change`, computed here if not yet) when they are what one
        forward of the new tokens from `start` on, after the notes before it, leaves: the first
        change is at `start`, the notes before it sit where they were, and the tokens after went
        through the model at once (not in chunks). None otherwise."""
        p = min(common_prefix(self.old.token_ids, self.new_ids), len(self.new_ids))
        before = [b for b in self.blocks if b.j1 < start]
        if p != start or any(not b.reuse or b.i1 != b.j1 or b.j2 > start for b in before):
            return None
        at_once = splits_on_this_device(self.model) or joins(self.model)  # `extend` takes it whole
        if len(self.new_ids) - p > CHUNK_TOKENS and not at_once:
            return None
        return self.from_first_change().layers

    def first_change_kv(self, b: Block) -> list[KV] | None:
        """The K/V of the changed block `b` as the reference already computed them
        (`from_first_change`, when it has run), if `b` is the first change: the notes before it are
        the old ones at their own positions, so computing `b` after them runs the same tokens at the
        same positions after the same notes as the reference did (equal up to float rounding).
        None otherwise (a later change follows re-rotated notes, not the reference's)."""
        if b.reuse or self._from_change is None:
            return None
        p = min(common_prefix(self.old.token_ids, self.new_ids), len(self.new_ids))
        if b.j1 != p or any(not x.reuse or x.i1 != x.j1 for x in self.blocks if x.j2 <= b.j1):
            return None
        return cut(self._from_change.layers, b.j1, b.j2)

    def reused(self, b: Block) -> list[KV]:
        """An equal block's old K/V, keys re-rotated to its new positions."""
        return shift(cut(self.old.layers, b.i1, b.i1 + b.j2 - b.j1), self.rope, b.j1 - b.i1)

    def changed(self) -> list[int]:
        """The positions of the new tokens no old token equals (the fields, and any token whose
        boundaries moved)."""
        return [j for b in self.blocks if not b.reuse for j in range(b.j1, b.j2)]

    def can_defer(self) -> bool:
        """The editor defers (not `eager`) and one custom mask can carry this model's attention (no
        sliding windows)."""
        return self.defers and not has_sliding_window(self.model)

    def base(self) -> list[KV]:
        """Reused blocks re-rotated to their new positions, zeros where changed blocks go."""
        return join_all([self.reused(b) if b.reuse else self.placeholder(b) for b in self.blocks])

    def deferring(self, base: list[KV], positions: list[int], detail: str = "") -> Surgery:
        """`base` with `positions` left for the readout to compute."""
        surgery = self.surgery(base, len(positions), detail)
        surgery.deferred = Deferred(tuple(positions), tuple(self.new_ids[j] for j in positions))
        return surgery

    def placeholder(self, b: Block) -> list[KV]:
        """Zeros where a changed block goes: recomputed before anything reads it."""
        return [(k.new_zeros(*k.shape[:2], b.j2 - b.j1, k.shape[3]),
                 v.new_zeros(*v.shape[:2], b.j2 - b.j1, v.shape[3]))
                for k, v in self.old.layers]


def with_erratum(surgery: Surgery, erratum_ids: list[int]) -> Surgery:
    """`surgery` with an erratum's tokens appended, left to the readout's forward (`pending`)."""
    n = len(erratum_ids)
    return Surgery(surgery.layers, surgery.token_ids + erratum_ids, surgery.segments + [ERRATUM] * n,
                   surgery.offsets + [(-1, -1)] * n, surgery.tokens_computed + n, surgery.detail,
                   pending=list(erratum_ids), deferred=surgery.deferred)
