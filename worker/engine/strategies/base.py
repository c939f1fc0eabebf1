"""The one interface every strategy implements, and the registries that gather them.

In the style of transformers' cache classes: one small class per strategy, in a file of its own,
carrying its torch-free descriptor (`vocabulary.StrategyInfo`: name, help, what it recomputes,
moves_keys, can_defer, role, colour, rank, ...) and its algorithm. Defining the class registers it
(`Strategy.__init_subclass__`) in its kind's registry; no list names it and no order matters (lists
follow the descriptors' `rank`). A run asks the registry for the classes by name once; after that
it reads facts and calls methods, and never compares a strategy's name with a string.

A strategy's life in one run (`worker.engine.strategies.measure`):

    needs()           the strategies whose notes it is made of (itself; a composite: its parts)
    prepare(case)     work a deployment does once, outside the timings (e.g. hoist's layout)
    surgery(case)     its notes for the new text: timed, run again for the timing repeats
    decision_surgery(case)  its notes when nothing is timed (a sweep's decision-only edit): the
                      same notes by default; the reference computes them exactly from the field on
    cached_ids(case)  what an exact-prefix serving cache holds before the edit (its prefix share)
    outcome(outcomes) its measured outcome (a composite builds it from its parts')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from vocabulary import StrategyInfo
from vocabulary.strategies import unknown_names
from worker.engine.types import EngineError

if TYPE_CHECKING:
    from worker.engine.edit import Surgery

CaseT = TypeVar("CaseT")
OutcomeT = TypeVar("OutcomeT")


class Strategy(Generic[CaseT]):
    """One way to get notes for the changed text. Subclasses set `info` and write `surgery`;
    defining one registers it in its kind's registry (`REGISTRIES`)."""

    info: ClassVar[StrategyInfo]
    reads_notes: ClassVar[bool] = True  # starts from the cached notes (pays their splice); recompute does not
    # its notes are the changed tokens computed alone, nothing else refreshed: the notes map and the
    # mechanism start from them (beside the reference's and the floor's), taken from the run when it
    # measured this strategy (one edit strategy says so: `Registry.field_alone`)
    field_alone: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "info" in cls.__dict__:
            REGISTRIES[cls.info.kind].add(cls)

    @property
    def name(self) -> str:
        return self.info.name

    def needs(self) -> tuple[str, ...]:
        """The strategies measured for this one: itself, or a composite's parts."""
        return (self.name,)

    def follow(self, policy: str | None) -> None:
        """The strategy a notebook adopted from a sweep's policy (None: none); only a composite
        that picks among others (auto) reads it."""

    def judge_by(self, values: tuple[str, ...], choices: tuple[str, ...]) -> None:
        """What the agreement rule (`vocabulary.agreement`) needs to compare two answers: the
        fields' old and new values and the question's choices; only a composite that compares its
        parts' decisions (auto) reads them."""

    def prepare(self, case: CaseT) -> None:
        """Work done once, before and outside the timings (nothing by default)."""

    def surgery(self, case: CaseT) -> Surgery:
        raise NotImplementedError(f"{self.name} has no notes of its own")

    def decision_surgery(self, case: CaseT) -> Surgery:
        """Its notes in a run that times nothing (`measure(..., timing=False)`): its surgery, unless
        the same notes can be had for less (the reference, exactly from the first change on)."""
        return self.surgery(case)

    def cached_ids(self, case: CaseT) -> list[int]:
        """The tokens an exact-prefix serving cache holds before the change."""
        return list(case.cached_ids)  # type: ignore[attr-defined]

    def outcome(self, outcomes: dict[str, OutcomeT]) -> OutcomeT:
        """Its measured outcome (`measure.Outcome`); a composite builds its own from its parts'."""
        return outcomes[self.name]


class Registry:
    """The strategy classes of one kind, by name, in their descriptors' `rank` order."""

    def __init__(self, kind: str, what: str, valid: str):
        self.kind, self.what, self.valid = kind, what, valid  # the words of the unknown-name message
        self.classes: dict[str, type[Strategy]] = {}

    def add(self, cls: type[Strategy]) -> None:
        """Register `cls` under its descriptor's name; a second class of the same name is an error
        (the same class imported again replaces itself)."""
        name, known = cls.info.name, self.classes.get(cls.info.name)
        if known is not None and _where(known) != _where(cls):
            raise RuntimeError(f"two {self.kind} strategies are named {name!r}: "
                               f"{_where(known)} and {_where(cls)}")
        self.classes[name] = cls
        self.classes = {n: self.classes[n] for n in sorted(self.classes, key=self._rank)}

    def _rank(self, name: str) -> tuple[int, str]:
        return self.classes[name].info.rank, name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.classes)

    @property
    def infos(self) -> dict[str, StrategyInfo]:
        return {name: cls.info for name, cls in self.classes.items()}

    def field_alone(self) -> str:
        """The name of the one strategy whose notes are the changed tokens computed alone."""
        names = [name for name, cls in self.classes.items() if cls.field_alone]
        if len(names) != 1:
            raise LookupError(f"{len(names)} {self.kind} strategies compute the field alone: {names}")
        return names[0]

    def unknown(self, names: Iterable[str]) -> str:
        """'' when every name is registered, else one line naming the unknown ones and the valid ones."""
        return unknown_names(list(names), self.infos, self.what, self.valid)

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


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


REGISTRIES: dict[str, Registry] = {
    "edit": Registry("edit", "strategy", "valid strategies"),
    "compose": Registry("compose", "compose strategy", "valid"),
}
