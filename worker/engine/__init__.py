"""The kvnotes engine: notes (the KV cache a model writes at prefill), editing and composing them.

    from worker.engine import load, Field, Question
    eng = load("smollm2-135m")
    notes = eng.prefill(document)
    report = eng.edit(notes, fields=[Field(start, end, "new value", "label")],
                      question=Question("…?", choices=("approve", "deny")))

The names below are loaded on first use (PEP 562), so `import vocabulary` — the
torch-free words the web app shares with the engine — does not load torch.

Import floors, bottom to top: a module imports only from its own floor or below, never up
(tests/engine/test_floors.py reads this list; a new module goes on its concept's floor).

    1 plumbing: types mechanism.types compare devices models tiny offsets store store_guard
        store_index store_files store_s3 store_redis store_tiers fingerprint attention_plan
        split_attention
    2 notes: rope notes
    3 forward: forward selective orders mechanism.masked
    4 readout and surgery: readout batched decode edit compose attention loaded mechanism.knockout
        mechanism.lens
        mechanism.selective_k
    5 strategies: strategies strategies.base strategies.edit strategies.compose strategies.measure
        strategies.__main__ strategies.edits strategies.edits.* strategies.compositions
        strategies.compositions.*
    6 analyses of a run's notes: attribution mechanism
    7 the measure loops: run blend trajectory carry
    8 the facade: engine

Notes and RoPE at the bottom; the forward pass and the readout above them; the surgery every
strategy shares (`edit.Editor`, `compose`'s splice); the strategies (one file each) and the measure
loop that times them; what a run adds (the notes map, the mechanism); the loops that run a request
(`run` for edits, `blend` for compositions, `trajectory` for turns, each strategy carrying (`carry`)
its cache forward); and `Engine`, which loads a model and offers them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS = {
    "Engine": "worker.engine.engine",
    "load": "worker.engine.engine",
    "Notes": "worker.engine.notes",
    "NotPortableError": "worker.engine.rope",
    "STRATEGIES": "vocabulary",
    "Attention": "worker.engine.types",
    "EngineError": "worker.engine.types",
    "Field": "worker.engine.types",
    "Placement": "worker.engine.compose",
    "Question": "worker.engine.types",
    "Report": "worker.engine.types",
    "RunRequest": "worker.engine.run",
    "StrategyResult": "worker.engine.types",
    "TokenView": "worker.engine.types",
}

__all__ = [
    "STRATEGIES", "Attention", "Engine", "EngineError", "Field", "NotPortableError", "Notes", "Placement",
    "Question", "Report", "RunRequest", "StrategyResult", "TokenView", "load",
]

if TYPE_CHECKING:
    from vocabulary import STRATEGIES
    from worker.engine.compose import Placement
    from worker.engine.engine import Engine, load
    from worker.engine.notes import Notes
    from worker.engine.rope import NotPortableError
    from worker.engine.run import RunRequest
    from worker.engine.types import Attention, EngineError, Field, Question, Report, StrategyResult, TokenView


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
