"""Strategies as objects: one small class per strategy behind one interface (`base.Strategy`), each
in a file of its own under `edits/` (a field of a document changes) or `compositions/` (skills are
spliced into a context), carrying its descriptor and its algorithm. Importing this package imports
every file of those two folders; each class registers itself in its kind's registry (`EDITS`,
`COMPOSITIONS`). `measure` times them all the same way.

    from worker.engine.strategies import EDITS
    strategies = EDITS.build(["recompute", "hoist", "auto"])   # {name: Strategy}

Adding a strategy is adding one file to `edits/` or `compositions/`, then writing the descriptors
the torch-free side reads: `python -m worker.engine.strategies` (vocabulary/strategies.json).
"""

from __future__ import annotations

import importlib
import pkgutil

from vocabulary.strategies import descriptors_json
from worker.engine.strategies.base import REGISTRIES, Registry, Strategy

PACKAGES = ("worker.engine.strategies.edits", "worker.engine.strategies.compositions")


def discover(package: str) -> list[str]:
    """Import every module of `package` (each strategy file registers its class); their names."""
    found = importlib.import_module(package)
    names = [m.name for m in pkgutil.iter_modules(found.__path__, package + ".")]
    for name in names:
        importlib.import_module(name)
    return names


def descriptors() -> str:
    """The descriptors of every registered strategy, as `vocabulary/strategies.json` holds them."""
    return descriptors_json({kind: list(registry.infos.values()) for kind, registry in REGISTRIES.items()})


for _package in PACKAGES:
    discover(_package)

EDITS = REGISTRIES["edit"]
COMPOSITIONS = REGISTRIES["compose"]

__all__ = ["COMPOSITIONS", "EDITS", "PACKAGES", "Registry", "Strategy", "descriptors", "discover"]
