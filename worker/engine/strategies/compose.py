"""What every compose strategy reads (`BlendCase`: a context made of many precompiled skills) and
the surgery they share: splice the compiled skills into place (`worker.engine.compose`), recompute
chosen tokens. The strategies themselves are one file each in
`worker/engine/strategies/compositions/`: the class with its descriptor and its algorithm.

`seam`, `epic` and `selective` leave their tokens to the readout's forward (`forward.Deferred`) on
models without sliding windows: the same K/V, one pass over the weights fewer. `prefix_reuse`'s
cached notes (the context followed by the first skill, computed together) are prepared outside the
timings, as the skills themselves are compiled outside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.engine.compose import Layout, splice_all
from worker.engine.edit import Surgery
from worker.engine.forward import Deferred
from worker.engine.notes import KV, Notes
from worker.engine.selective import has_sliding_window, recompute_selected


@dataclass
class BlendCase:
    """What every compose strategy reads: the context's notes, the compiled skills, where they go
    (`layout`), and the knobs."""

    model: Any
    context: Notes
    skills: tuple[Notes, ...]
    layout: Layout
    seams: tuple[int, ...] = ()  # splice's own seam repair per skill
    seam_tokens: int = 4
    epic_tokens: int = 16
    selective_fraction: float = 0.15

    @property
    def ids(self) -> list[int]:
        return list(self.layout.token_ids)

    @property
    def cached_ids(self) -> list[int]:
        """What a serving engine's prefix cache holds from an earlier prompt: the context up to and
        with the first skill."""
        return self.ids[: self.layout.first_skill[1]]

    def spliced(self) -> list[KV]:
        seams = list(self.seams) or None
        return splice_all(self.model, self.context, list(self.skills), self.layout, seams).layers

    def surgery(self, layers: list[KV], computed: int, detail: str = "",
                deferred: Deferred | None = None) -> Surgery:
        layout = self.layout
        return Surgery(layers, self.ids, list(layout.segments), list(layout.offsets), computed, detail,
                       deferred=deferred)

    def recomputed(self, spliced: list[KV], chosen: list[int], detail: str) -> Surgery:
        """`spliced` with the `chosen` tokens recomputed: left to the readout's forward (deferred)
        where one mask can carry the model's attention, else in a forward of their own."""
        if not chosen or has_sliding_window(self.model):
            layers = recompute_selected(self.model, spliced, self.ids, chosen)
            return self.surgery(layers, len(chosen), detail)
        deferred = Deferred(tuple(chosen), tuple(self.ids[j] for j in chosen))
        return self.surgery(spliced, len(chosen), detail, deferred)

    def first_of_every_skill(self, k: int, what: str) -> Surgery:
        chosen = [j for start, end in self.layout.spans for j in range(start, min(end, start + k))]
        return self.recomputed(self.spliced(), chosen, f"the first {k} tokens of every skill ({what})")
