"""The kvnotes engine: notes (the KV cache a model writes at prefill), editing and composing them.

    from worker.engine import load, Field, Question
    eng = load("smollm2-135m")
    notes = eng.prefill(document)
    report = eng.edit(notes, fields=[Field(start, end, "new value", "label")],
                      question=Question("…?", choices=("approve", "deny")))

The names below are loaded on first use (PEP 562), so `import vocabulary` — the
torch-free words the web app shares with the engine — does not load torch.
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
