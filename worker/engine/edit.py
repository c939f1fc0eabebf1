"""Edit: changing fields of a document whose notes are already cached — every strategy of the paper.

The old notes hold the tokens of the old text; the new text tokenizes to `new_ids`. A token-level
diff (difflib, no junk heuristic) splits the new sequence into blocks equal to old tokens and
changed blocks (the fields, plus any token whose boundaries moved). Each strategy decides what to
recompute:

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

from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher

from vocabulary import ERRATUM
from vocabulary.prefix import common_prefix
from worker.engine.forward import Deferred, cut, extend, fill, fresh, join_all
from worker.engine.notes import KV, Notes
from worker.engine.rope import RopeLayout, shift_keys
from worker.engine.selective import (
    SELECTION_LAYERS,
    has_sliding_window,
    movement,
    recompute_selected,
    top_fraction,
)


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
    """Applies strategies to one (old notes → new tokens) change."""

    def __init__(self, model, rope: RopeLayout | None, old: Notes, new_ids: list[int],
                 new_segments: list[str], new_offsets: list[tuple[int, int]]):
        self.model, self.rope, self.old = model, rope, old
        self.new_ids, self.new_segments, self.new_offsets = new_ids, new_segments, new_offsets
        self.blocks = diff_blocks(old.token_ids, new_ids)

    def _surgery(self, layers: list[KV], computed: int, detail: str = "") -> Surgery:
        return Surgery(layers, list(self.new_ids), list(self.new_segments), list(self.new_offsets),
                       computed, detail)

    def recompute(self) -> Surgery:
        return self._surgery(extend(self.model, None, self.new_ids), len(self.new_ids))

    def prefix_reuse(self) -> Surgery:
        p = min(common_prefix(self.old.token_ids, self.new_ids), len(self.new_ids))
        layers = extend(self.model, cut(self.old.layers, 0, p), self.new_ids[p:])
        return self._surgery(layers, len(self.new_ids) - p)

    def stale(self) -> Surgery:
        o = self.old
        return Surgery(o.layers, list(o.token_ids), list(o.segments), list(o.offsets), 0)

    def _reused(self, b: Block) -> list[KV]:
        """An equal block's old K/V, keys re-rotated to its new positions."""
        return shift(cut(self.old.layers, b.i1, b.i1 + b.j2 - b.j1), self.rope, b.j1 - b.i1)

    def _changed(self) -> list[int]:
        return [j for b in self.blocks if not b.reuse for j in range(b.j1, b.j2)]

    def _can_defer(self) -> bool:
        return not has_sliding_window(self.model)

    def _base(self) -> list[KV]:
        """Reused blocks re-rotated to their new positions, zeros where changed blocks go."""
        return join_all([self._reused(b) if b.reuse else self._placeholder(b) for b in self.blocks])

    def _deferring(self, base: list[KV], positions: list[int], detail: str = "") -> Surgery:
        """`base` with `positions` left for the readout to compute."""
        surgery = self._surgery(base, len(positions), detail)
        surgery.deferred = Deferred(tuple(positions), tuple(self.new_ids[j] for j in positions))
        return surgery

    def in_place(self, defer: bool = False) -> Surgery:
        """With `defer` (and a model without sliding windows) the changed tokens are left to the
        readout's forward (`Surgery.deferred`): the same K/V, one pass over the weights fewer."""
        changed = self._changed()
        if defer and changed and self._can_defer():
            return self._deferring(self._base(), changed)
        pieces: list[list[KV]] = []
        computed = 0
        for b in self.blocks:
            if b.reuse:
                pieces.append(self._reused(b))
            else:
                before = join_all(pieces)
                pieces = [before, fresh(self.model, before, self.new_ids[b.j1:b.j2])] if before else \
                    [extend(self.model, None, self.new_ids[b.j1:b.j2])]
                computed += b.j2 - b.j1
        return self._surgery(join_all(pieces), computed)

    def selective(self, fraction: float, defer: bool = False) -> Surgery:
        """The changed tokens and the top `fraction` of downstream tokens, all recomputed in one
        pass over the reused notes (the changed tokens' own old K/V are never read: selected
        positions see each other's fresh K/V only). With `defer`, that pass is the readout's."""
        changed = self._changed()
        if not changed or fraction <= 0:
            return replace(self.in_place(defer), detail=f"fraction {fraction:.0%}, nothing downstream")
        start = changed[0]
        downstream = [j for b in self.blocks if b.reuse and b.j1 >= start for j in range(b.j1, b.j2)]
        base = self._base()
        moved = movement(self.model, base, self.new_ids, start)  # [T_new - start]
        ranked = top_fraction(moved, downstream, start, fraction)
        detail = (f"{len(ranked)} of {len(downstream)} downstream tokens ({fraction:.0%}), "
                  f"ranked by layer-{SELECTION_LAYERS - 1} K/V movement")
        chosen = sorted(changed + ranked)
        if defer and self._can_defer():
            return self._deferring(base, chosen, detail)
        return self._surgery(recompute_selected(self.model, base, self.new_ids, chosen), len(chosen), detail)

    def _placeholder(self, b: Block) -> list[KV]:
        """Zeros where a changed block goes: recomputed before anything reads it."""
        return [(k.new_zeros(*k.shape[:2], b.j2 - b.j1, k.shape[3]),
                 v.new_zeros(*v.shape[:2], b.j2 - b.j1, v.shape[3]))
                for k, v in self.old.layers]

    def erratum(self, erratum_ids: list[int]) -> Surgery:
        o = self.old
        return Surgery(o.layers, o.token_ids + erratum_ids, o.segments + [ERRATUM] * len(erratum_ids),
                       o.offsets + [(-1, -1)] * len(erratum_ids), len(erratum_ids), pending=list(erratum_ids))

    def field_erratum(self, erratum_ids: list[int], defer: bool = False) -> Surgery:
        base = self.in_place(defer)
        return Surgery(base.layers, base.token_ids + erratum_ids,
                       base.segments + [ERRATUM] * len(erratum_ids),
                       base.offsets + [(-1, -1)] * len(erratum_ids), base.tokens_computed + len(erratum_ids),
                       pending=list(erratum_ids), deferred=base.deferred)
