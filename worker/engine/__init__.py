"""The kvnotes engine: notes (the KV cache a model writes at prefill), editing and composing them.

    from worker.engine import load, Field, Question
    eng = load("smollm2-135m")
    notes = eng.prefill(document)
    report = eng.edit(notes, fields=[Field(start, end, "new value", "label")],
                      question=Question("…?", choices=("approve", "deny")))
"""

from worker.engine.engine import Engine, Placement, load
from worker.engine.notes import Notes
from worker.engine.rope import NotPortableError
from worker.engine.types import (
    STRATEGIES,
    Attention,
    EngineError,
    Field,
    Question,
    Report,
    StrategyResult,
    TokenView,
)

__all__ = [
    "STRATEGIES", "Attention", "Engine", "EngineError", "Field", "NotPortableError", "Notes", "Placement",
    "Question", "Report", "StrategyResult", "TokenView", "load",
]
