"""What each strategy is, as facts every layer reads: one frozen descriptor per strategy.

The engine's strategy classes (`worker/engine/strategies/`) each carry their descriptor; the run
form, the CLI's help, the API's schema and the docs read the same descriptors, so a strategy's name,
help and facts live in one place. Like transformers' cache classes, the facts a caller branches on
are attributes (`moves_keys`, `can_defer`, `parts`), never a name compared with a string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["reference", "floor", "candidate", "composite"]
ROLES: tuple[Role, ...] = ("reference", "floor", "candidate", "composite")


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
    colour: its colour on every page, chip and drawing (`#rrggbb`; a name two kinds share has one)."""

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



def _edit(name: str, help: str, recomputes: str, **facts) -> StrategyInfo:
    return StrategyInfo(name, "edit", help, recomputes, **facts)


def _compose(name: str, help: str, recomputes: str, **facts) -> StrategyInfo:
    return StrategyInfo(name, "compose", help, recomputes, **facts)


EDIT_INFO: dict[str, StrategyInfo] = {info.name: info for info in (
    _edit("recompute", "the reference: prefill everything again", "every token (the oracle)",
          default=True, exact=True, role="reference", colour="#3d4350"),
    _edit("prefix_reuse", "recompute from the first field to the end (exact, what a prefix cache does)",
          "every token from the first change on", default=True, exact=True, colour="#0072b2"),
    _edit("stale", "recompute nothing: the floor, the model acts on the old notes", "nothing", default=True,
          role="floor", colour="#d55e00"),
    _edit("in_place", "recompute only the field's tokens; later keys re-rotated",
          "the changed tokens; equal tokens keep their K/V, keys re-rotated by the length change",
          moves_keys=True, can_defer=True, default=True, colour="#e69f00"),
    _edit("erratum", "append a correction and compute only its tokens", "an appended correction only",
          can_defer=True, default=True, colour="#cc79a7"),
    _edit("field_erratum", "refresh the field and append the correction (the robust default)",
          "the changed tokens and the appended correction", moves_keys=True, can_defer=True, default=True,
          colour="#009e73"),
    _edit("selective", "field + the downstream tokens whose notes moved most",
          "the changed tokens and the top fraction of downstream tokens whose layer-1 K/V moved most "
          "(CacheBlend's rule)", moves_keys=True, can_defer=True, colour="#56b4e9"),
    _edit("hoist", "the field's line moved after the document: an edit computes only that tail "
          "(the paper's hoist-to-end baseline)",
          "the hoisted line holding the new value; the document without it is kept", can_defer=True,
          colour="#7b5ea7"),
    _edit("auto", "the cheapest strategy that matches field_erratum on a probe",
          "its pick's tokens, after probing the cheaper candidates", moves_keys=True,
          parts=("stale", "erratum", "in_place"), role="composite", colour="#b8a200"),
)}

COMPOSE_INFO: dict[str, StrategyInfo] = {info.name: info for info in (
    _compose("recompute", "the reference: prefill the whole composed prompt", "the whole composed prompt",
             default=True, exact=True, role="reference", colour="#3d4350"),
    _compose("splice", "full reuse: every skill's notes re-rotated into place, nothing recomputed",
             "nothing (with a seam, the first tokens of every skill)", moves_keys=True, default=True,
             colour="#999933"),
    _compose("seam", "splice, then the first K tokens of every skill recomputed with the real prefix "
             "(seam repair)", "the first K = 4 tokens of every skill", moves_keys=True, can_defer=True,
             colour="#882255"),
    _compose("epic", "splice, then the first k = 16 tokens of every skill recomputed (EPIC)",
             "the first k = 16 tokens of every skill", moves_keys=True, can_defer=True, colour="#44aa99"),
    _compose("selective", "splice, then the 15% of reused tokens whose first-layer K/V move most "
             "recomputed (CacheBlend)", "the 15% of reused tokens whose layer-1 K/V move most",
             moves_keys=True, can_defer=True, colour="#56b4e9"),
    _compose("prefix_reuse", "exact: the context and the first skill reused as a prefix cache holds them, "
             "the rest recomputed", "everything after the first skill", exact=True, colour="#0072b2"),
)}


def _unknown(names: list[str] | tuple[str, ...], known: dict[str, StrategyInfo], what: str,
             valid: str) -> str:
    unknown = [name for name in names if name not in known]
    if not unknown:
        return ""
    return f"unknown {what} {', '.join(map(repr, unknown))}; {valid}: {', '.join(known)}"


def unknown_strategies(names: list[str] | tuple[str, ...]) -> str:
    """'' when every name is an edit strategy, else one line naming the unknown ones and the valid ones."""
    return _unknown(names, EDIT_INFO, "strategy", "valid strategies")


def unknown_compose_strategies(names: list[str] | tuple[str, ...]) -> str:
    """'' when every name is a compose strategy, else one line naming the unknown ones."""
    return _unknown(names, COMPOSE_INFO, "compose strategy", "valid")


def by_role(role: Role, infos: dict[str, StrategyInfo] | None = None) -> str:
    """The name of the one strategy of `infos` (the edits by default) that plays `role`."""
    names = [name for name, info in (EDIT_INFO if infos is None else infos).items() if info.role == role]
    if len(names) != 1:
        raise LookupError(f"{len(names)} strategies play the role {role!r}: {names}")
    return names[0]


def colours() -> dict[str, str]:
    """Every strategy's colour by name, edit and compose alike (a name both kinds use has one)."""
    return {name: info.colour for infos in (COMPOSE_INFO, EDIT_INFO) for name, info in infos.items()}


def with_recompute(names: list[str] | tuple[str, ...]) -> list[str]:
    """`recompute` first (every strategy is measured against it), then the others once each."""
    return [REFERENCE, *dict.fromkeys(name for name in names if name != REFERENCE)]


REFERENCE = by_role("reference")  # every strategy is measured against it (edit and compose alike)
FLOOR = by_role("floor")  # recomputes nothing: the model acts on the old notes

# The names and words earlier code reads, derived from the descriptors (one place for each fact).
STRATEGIES = tuple(EDIT_INFO)
STRATEGY_HELP = {name: info.help for name, info in EDIT_INFO.items()}
DEFAULT_STRATEGIES = tuple(name for name, info in EDIT_INFO.items() if info.default)
AUTO_CANDIDATES = EDIT_INFO["auto"].parts
COMPOSE_STRATEGIES = tuple(COMPOSE_INFO)
DEFAULT_COMPOSE_STRATEGIES = tuple(name for name, info in COMPOSE_INFO.items() if info.default)
COMPOSE_HELP = {name: info.help for name, info in COMPOSE_INFO.items()}
