"""What each strategy is, as facts every layer reads: one frozen descriptor per strategy.

A strategy is one file (`worker/engine/strategies/edits/` or `compositions/`): its class carries
its descriptor and its algorithm, and registers itself. The torch-free side (the run form, the
CLI's help, the API's schema, the stylesheet fragment) reads the same descriptors from
`vocabulary/strategies.json`, which `python -m worker.engine.strategies` writes from the classes
(tests/engine/test_registry.py fails when the two differ). Like transformers' cache classes, the
facts a caller branches on are attributes (`moves_keys`, `can_defer`, `parts`, `role`,
`serving_layout`, `carrying`), never a name compared with a string.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Role = Literal["reference", "floor", "candidate", "composite"]
ROLES: tuple[Role, ...] = ("reference", "floor", "candidate", "composite")

# A strategy's serving layout: how a prompt sent to a serving engine carries a changed field, the
# way that strategy's notes hold it. The serving side (the replays in `serving.streams` and
# `serving.trajectory`, the erratum gateway in `serving.gateway.rewrite`) lays a prompt out by these
# words, never by a strategy's name; "" (the default): the strategy has none (a server cannot be
# asked for it: it recomputes everything, or keeps notes a prefix cache cannot hold).
REWRITE = "rewrite"  # the field rewritten where it stands: the prompt breaks at the field
APPEND_ERRATUM = "append_erratum"  # the prompt as it was, an erratum appended after it
REFRESH_ERRATUM = "refresh_erratum"  # the field rewritten where it stands, and the erratum appended
HOIST_FIELDS = "hoist_fields"  # the field's line moved after the document, holding the current value
SERVING_LAYOUTS = (REWRITE, APPEND_ERRATUM, REFRESH_ERRATUM, HOIST_FIELDS)

# A strategy's carrying: how a trajectory (`worker.engine.carry`) moves its cache to the next turn;
# "" (the default): a trajectory does not carry it.
OWN_SURGERY = "own_surgery"  # its own surgery on the cache as it stands; an erratum after the last turn
WHOLE_PROMPT = "whole_prompt"  # its notes of the whole current prompt, tokenized as one text each turn
FIELDS_LAST = "fields_last"  # the document laid out once with the fields' lines moved out, and those
#                              lines kept last: taken off and prefilled again after every turn's text
FOLLOWS_POLICY = "follows_policy"  # the strategy the adopted sweep policy names, at its cost (a composite)
CARRYINGS = (OWN_SURGERY, WHOLE_PROMPT, FIELDS_LAST, FOLLOWS_POLICY)


@dataclass(frozen=True)
class StrategyInfo:
    """One strategy's facts.

    name: what the run form, the CLI, the API and the database call it.
    kind: "edit" (a field of the document changes) or "compose" (skills are spliced into a context).
    help: one line for a tooltip.
    recomputes: what it runs through the model, in the paper's words.
    moves_keys: it re-rotates reused keys when the length changes (needs a portable RoPE).
    can_defer: the tokens it computes go through the readout's own forward (one pass fewer).
    default: ticked on a fresh run form.
    parts: a composite's candidates, cheapest first (auto's probes); empty for a plain strategy.
    exact: its notes equal recompute's (the decision cannot differ).
    role: what the pages ask for instead of a name: "reference" (every strategy is measured against
      it), "floor" (recomputes nothing: the model acts on the old notes), "composite" (picks among
      its parts), or "candidate" (every other).
    colour: its colour on every page, chip and drawing (`#rrggbb`; a name two kinds share has one).
    rank: where lists show it, lowest first (the reference at 0); ties go by name.
    appends_errata: it appends an erratum after the notes (a trajectory also runs it as
      `name.one_per_field`, which keeps one erratum per field).
    serving_layout: how a prompt sent to a server carries a changed field its way (one of
      `SERVING_LAYOUTS`; "": none). The replays' variants are the strategies whose layout they send,
      the gateway's policies those whose layout it writes, in rank order.
    carrying: how a trajectory carries its cache to the next turn (one of `CARRYINGS`; "": it is not
      carried)."""

    name: str
    kind: Literal["edit", "compose"]
    help: str
    recomputes: str
    moves_keys: bool = False
    can_defer: bool = False
    default: bool = False
    parts: tuple[str, ...] = ()
    exact: bool = False
    role: Role = "candidate"
    colour: str = "#3d4350"
    rank: int = 0
    appends_errata: bool = False
    serving_layout: str = ""
    carrying: str = ""

    def __post_init__(self) -> None:
        if self.serving_layout not in ("", *SERVING_LAYOUTS):
            raise ValueError(f"{self.name}: serving_layout {self.serving_layout!r} is none of "
                             f"{', '.join(SERVING_LAYOUTS)} (or \"\")")
        if self.carrying not in ("", *CARRYINGS):
            raise ValueError(f"{self.name}: carrying {self.carrying!r} is none of {', '.join(CARRYINGS)} "
                             "(or \"\")")

    @property
    def keeps_old_values(self) -> bool:
        """Its notes hold the fields' old values, never refreshed: the floor, and a strategy whose
        serving layout keeps the prompt as it was (an erratum appended after it)."""
        return self.role == "floor" or self.serving_layout == APPEND_ERRATUM


DESCRIPTORS = Path(__file__).with_name("strategies.json")


def read_descriptors(text: str) -> dict[str, dict[str, StrategyInfo]]:
    """{kind: {name: descriptor}} from the generated file's text, each kind in its `rank` order."""
    kinds: dict[str, dict[str, StrategyInfo]] = {"edit": {}, "compose": {}}
    for kind, rows in json.loads(text).items():
        infos = [StrategyInfo(**{**row, "parts": tuple(row.get("parts", ()))}) for row in rows]
        kinds[kind] = {info.name: info for info in sorted(infos, key=lambda i: (i.rank, i.name))}
    return kinds


def descriptors_json(kinds: dict[str, list[StrategyInfo]]) -> str:
    """The generated file's text for these descriptors (what `read_descriptors` reads back)."""
    rows = {kind: [asdict(info) for info in sorted(infos, key=lambda i: (i.rank, i.name))]
            for kind, infos in kinds.items()}
    return json.dumps(rows, indent=1, ensure_ascii=False) + "\n"


_KINDS = read_descriptors(DESCRIPTORS.read_text(encoding="utf-8"))
EDIT_INFO: dict[str, StrategyInfo] = _KINDS["edit"]
COMPOSE_INFO: dict[str, StrategyInfo] = _KINDS["compose"]


def unknown_names(names: list[str] | tuple[str, ...], known: dict[str, StrategyInfo], what: str,
                  valid: str) -> str:
    """'' when every name is in `known`, else one line naming the unknown ones and the valid ones."""
    unknown = [name for name in names if name not in known]
    if not unknown:
        return ""
    return f"unknown {what} {', '.join(map(repr, unknown))}; {valid}: {', '.join(known)}"


def unknown_strategies(names: list[str] | tuple[str, ...]) -> str:
    """'' when every name is an edit strategy, else one line naming the unknown ones and the valid ones."""
    return unknown_names(names, EDIT_INFO, "strategy", "valid strategies")


def unknown_compose_strategies(names: list[str] | tuple[str, ...]) -> str:
    """'' when every name is a compose strategy, else one line naming the unknown ones."""
    return unknown_names(names, COMPOSE_INFO, "compose strategy", "valid")


def by_role(role: Role, infos: dict[str, StrategyInfo] | None = None) -> str:
    """The name of the one strategy of `infos` (the edits by default) that plays `role`."""
    names = [name for name, info in (EDIT_INFO if infos is None else infos).items() if info.role == role]
    if len(names) != 1:
        raise LookupError(f"{len(names)} strategies play the role {role!r}: {names}")
    return names[0]


def served(layouts: tuple[str, ...], infos: dict[str, StrategyInfo] | None = None) -> dict[str, str]:
    """{name: serving layout} of the strategies of `infos` (the edits by default) whose serving layout
    is one of `layouts` (those a serving path sends), in rank order."""
    return {name: info.serving_layout for name, info in (EDIT_INFO if infos is None else infos).items()
            if info.serving_layout and info.serving_layout in layouts}


def colours() -> dict[str, str]:
    """Every strategy's colour by name, edit and compose alike (a name both kinds use has one)."""
    return {name: info.colour for infos in (COMPOSE_INFO, EDIT_INFO) for name, info in infos.items()}


def with_recompute(names: list[str] | tuple[str, ...]) -> list[str]:
    """`recompute` first (every strategy is measured against it), then the others once each."""
    return [REFERENCE, *dict.fromkeys(name for name in names if name != REFERENCE)]


REFERENCE = by_role("reference")  # every strategy is measured against it (edit and compose alike)
FLOOR = by_role("floor")  # recomputes nothing: the model acts on the old notes
EXACT_REUSE = next(name for name, info in EDIT_INFO.items() if info.exact and info.role == "candidate")
# the exact candidate (its notes equal the reference's, recomputed from the first change on): the
# cheapest strategy a decided sweep policy must beat, and what a serving prefix cache does

# The names and words earlier code reads, derived from the descriptors (one place for each fact).
STRATEGIES = tuple(EDIT_INFO)
STRATEGY_HELP = {name: info.help for name, info in EDIT_INFO.items()}
DEFAULT_STRATEGIES = tuple(name for name, info in EDIT_INFO.items() if info.default)
AUTO_CANDIDATES = EDIT_INFO[by_role("composite")].parts
COMPOSE_STRATEGIES = tuple(COMPOSE_INFO)
DEFAULT_COMPOSE_STRATEGIES = tuple(name for name, info in COMPOSE_INFO.items() if info.default)
COMPOSE_HELP = {name: info.help for name, info in COMPOSE_INFO.items()}
