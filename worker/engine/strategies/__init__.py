"""Strategies as objects: one small class per strategy behind one interface (`base.Strategy`),
gathered in two registries (edits and compositions) that match the vocabulary's descriptors one for
one. `measure` times them all the same way.

    from worker.engine.strategies import EDITS
    strategies = EDITS.build(["recompute", "hoist", "auto"])   # {name: Strategy}
"""

from __future__ import annotations

from vocabulary import COMPOSE_INFO, EDIT_INFO, unknown_compose_strategies, unknown_strategies
from worker.engine.strategies import compose, edit
from worker.engine.strategies.base import Registry, Strategy
from worker.engine.strategies.hoist import Hoist

EDITS = Registry(EDIT_INFO, (edit.Recompute, edit.PrefixReuse, edit.Stale, edit.InPlace, edit.Erratum,
                             edit.FieldErratum, edit.Selective, Hoist, edit.Auto), unknown_strategies)
COMPOSITIONS = Registry(COMPOSE_INFO, (compose.Recompute, compose.Splice, compose.Seam, compose.Epic,
                                       compose.Selective, compose.PrefixReuse), unknown_compose_strategies)

__all__ = ["COMPOSITIONS", "EDITS", "Registry", "Strategy"]
