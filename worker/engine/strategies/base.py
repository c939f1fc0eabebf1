"""The one interface every strategy implements, and the registry that gathers them.

In the style of transformers' cache classes: one small class per strategy, each carrying its
torch-free descriptor (`vocabulary.StrategyInfo`: name, help, what it recomputes, moves_keys,
can_defer, ...). A run asks the registry for the classes by name once; after that it reads facts
and calls methods, and never compares a strategy's name with a string.

A strategy's life in one run (`worker.engine.strategies.measure`):

    needs()           the strategies whose notes it is made of (itself; a composite: its parts)
    prepare(case)     work a deployment does once, outside the timings (e.g. hoist's layout)
    surgery(case)     its notes for the new text: timed, run again for the timing repeats
    cached_ids(case)  what an exact-prefix serving cache holds before the edit (its prefix share)
    outcome(outcomes) its measured outcome (a composite builds it from its parts')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from vocabulary import StrategyInfo
from worker.engine.types import EngineError

if TYPE_CHECKING:
    from worker.engine.edit import Surgery

CaseT = TypeVar("CaseT")
OutcomeT = TypeVar("OutcomeT")


class Strategy(Generic[CaseT]):
    """One way to get notes for the changed text. Subclasses set `info` and write `surgery`."""

    info: ClassVar[StrategyInfo]
    reads_notes: ClassVar[bool] = True  # starts from the cached notes (pays their splice); recompute does not

    @property
    def name(self) -> str:
        return self.info.name

    def needs(self) -> tuple[str, ...]:
        """The strategies measured for this one: itself, or a composite's parts."""
        return (self.name,)

    def prepare(self, case: CaseT) -> None:
        """Work done once, before and outside the timings (nothing by default)."""

    def surgery(self, case: CaseT) -> Surgery:
        raise NotImplementedError(f"{self.name} has no notes of its own")

    def cached_ids(self, case: CaseT) -> list[int]:
        """The tokens an exact-prefix serving cache holds before the change."""
        return list(case.cached_ids)  # type: ignore[attr-defined]

    def outcome(self, outcomes: dict[str, OutcomeT]) -> OutcomeT:
        """Its measured outcome (`measure.Outcome`); a composite builds its own from its parts'."""
        return outcomes[self.name]


class Registry:
    """The strategy classes of one kind, by name; exactly one class per descriptor."""

    def __init__(self, infos: dict[str, StrategyInfo], classes: Iterable[type[Strategy]],
                 unknown: Callable[[list[str]], str]):
        self.unknown = unknown  # the vocabulary's one line naming unknown names and the valid ones
        self.classes = {cls.info.name: cls for cls in classes}
        if list(self.classes) != list(infos):
            raise RuntimeError(f"descriptors {list(infos)} but strategy classes {list(self.classes)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.classes)

    def build(self, names: Iterable[str]) -> dict[str, Strategy]:
        """A fresh strategy object per name (a run's own state), and every part a composite needs."""
        names = list(names)
        problem = self.unknown(names)
        if problem:
            raise EngineError(problem)
        return {name: self.classes[name]() for name in dict.fromkeys(names)}

    def runners(self, strategies: dict[str, Strategy]) -> dict[str, Strategy]:
        """The strategies whose notes are measured: every one asked for and every part, in order,
        composites themselves left out (they are made of their parts' outcomes)."""
        needed = [part for s in strategies.values() for part in s.needs()]
        runners = self.build(dict.fromkeys(needed))
        return {name: strategies.get(name, runner) for name, runner in runners.items()}
