"""A trajectory replayed on a server: the agent loop of `vocabulary.trajectories` as chat requests,
one per turn, in order, each variant carrying the field changes its own way.

Turn t's prompt is turn t-1's plus what turn t appends (a tool result, a message), then the turn's
question (the turn's own, else the trajectory's), which ends the request and is not carried into
the next turn's prompt. Each variant is a strategy, and carries the field changes the way its
descriptor's serving layout says (`vocabulary.replay.LAYOUT_OF`):

- `REWRITE`: the document with the fields' current values, then the turns' text: a changed field
  is rewritten where it stands, so the prompt breaks there (recompute's prompt);
- `APPEND_ERRATUM`: the document as it was, and at the turn a field changed, after that turn's
  text, an erratum (`vocabulary.render_erratum(label, value it last named, new value)`), which
  every later turn keeps in its prefix (every erratum is kept, as the engine's strategy keeps them);
- `HOIST_FIELDS`: the fields' lines moved after the document AND the turns, holding the current
  values (`vocabulary.trajectories.hoisted_prompt`, the layout the engine's strategy carries): the
  body and the turns' text are a prefix that only grows; the moved lines (a newline first when the
  text before them does not end with one) and the question are the end.

A skill a turn places (`TurnSpec.skill`) is its text, before the turn's appended text, as the
engine's exact strategies prefill it.

Per variant (one after another, concurrency 1 within a variant: an agent loop is sequential): the
server's prefix cache emptied where it allows, a warm request (the prompt before any turn: the
document as the variant lays it out and the trajectory's question; unmeasured, as the edit replay's
warm request), then the turns. Measured per turn: TTFT, prompt tokens and the tokens the server took
from its prefix cache (`usage.prompt_tokens_details.cached_tokens`), the answer and whether it
names the fields' current values; per variant the overall hit rate, checked against `/metrics`, and
the cumulative TTFT. Every prompt is tokenized by the server first and checked against its
`max_model_len`: a turn that cannot fit fails the replay, naming the turn and the length, before the
first request.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from serving.replay import Progress
from serving.server import ReplayError, ReplayStopped, Server, ServerInfo
from serving.session import Bounds, checked_lengths, delta, open_backend, warm_up
from vocabulary import render_erratum
from vocabulary.prefix import common_prefix
from vocabulary.prompt import question_text
from vocabulary.replay import (
    LAYOUT_OF,
    VARIANTS,
    TrajectoryReplayResult,
    TrajectoryReplaySpec,
    TrajectoryVariantResult,
    TurnHit,
)
from vocabulary.strategies import APPEND_ERRATUM, HOIST_FIELDS, REWRITE
from vocabulary.trajectories import hoisted_prompt
from vocabulary.verdicts import edit_followed


@dataclass(frozen=True)
class PlannedTurn:
    """One turn of a variant's stream. `prefix`: the part of the prompt the next turn's prompt starts
    with (the document as laid out and the turns so far; with appended errata, those too); `content`: the
    user message sent (the prefix, hoist's moved lines, the question). `moved` pairs each field
    that differs from its first value with (the value before its last change, its value now)."""

    variant: str
    index: int
    prefix: str
    content: str
    choices: tuple[str, ...]
    changed: tuple[str, ...]
    moved: tuple[tuple[str, str, str], ...]
    errata: int


def _with_values(spec: TrajectoryReplaySpec, values: dict[str, str]) -> str:
    text = spec.document
    for f in sorted(spec.fields, key=lambda f: f.start, reverse=True):
        text = text[:f.start] + values[f.label] + text[f.end:]
    return text


def _rewritten(spec: TrajectoryReplaySpec, values: dict[str, str], stream: str) -> tuple[str, str]:
    prefix = _with_values(spec, values) + stream
    return prefix, prefix


def _as_it_was(spec: TrajectoryReplaySpec, values: dict[str, str], stream: str) -> tuple[str, str]:
    prefix = spec.document + stream  # the errata are in the stream
    return prefix, prefix


def _hoisted(spec: TrajectoryReplaySpec, values: dict[str, str], stream: str) -> tuple[str, str]:
    kept, block = hoisted_prompt(spec.document, spec.fields, values, stream)
    return kept, kept + block


# Each serving layout's (prefix, prompt before the question) (every layout of `REPLAY_LAYOUTS`).
LAYOUTS = {REWRITE: _rewritten, APPEND_ERRATUM: _as_it_was, HOIST_FIELDS: _hoisted}


def _prompt(spec: TrajectoryReplaySpec, variant: str, values: dict[str, str], stream: str) -> tuple[str, str]:
    """(prefix, prompt before the question) of `variant` with the fields at `values` and `stream`
    (the turns' text, with the errata of a variant that appends them) after the document."""
    if variant not in LAYOUT_OF:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    return LAYOUTS[LAYOUT_OF[variant]](spec, values, stream)


def plan_turns(spec: TrajectoryReplaySpec, variant: str) -> tuple[str, list[PlannedTurn]]:
    """The warm prompt (before any turn, with the trajectory's question) and one request per turn."""
    first = {f.label: spec.document[f.start:f.end] for f in spec.fields}
    values, told, previous = dict(first), dict(first), dict(first)
    skills = {s.name: s.text for s in spec.skills}
    _, before = _prompt(spec, variant, values, "")
    warm = before + question_text(spec.question, spec.choices)
    stream, errata, planned = "", 0, []
    for index, turn in enumerate(spec.turns):
        changed = [label for label, value in turn.fields.items() if value != values[label]]
        for label in changed:
            previous[label] = values[label]
        values.update(turn.fields)
        stream += (skills[turn.skill] if turn.skill is not None else "") + turn.append
        if LAYOUT_OF.get(variant) == APPEND_ERRATUM:
            for label in changed:
                stream += render_erratum(label, told[label], values[label])
                told[label] = values[label]
            errata += len(changed)
        question, choices = ((spec.question, spec.choices) if turn.question is None
                             else (turn.question, tuple(turn.choices or ())))
        prefix, prompt = _prompt(spec, variant, values, stream)
        moved = tuple((label, previous[label], values[label]) for label in values
                      if values[label] != first[label])
        planned.append(PlannedTurn(variant, index, prefix, prompt + question_text(question, choices), choices,
                                   tuple(changed), moved, errata))
    return warm, planned


# ---- running it ---------------------------------------------------------------------------------


def _field_of(problem: str) -> str:
    """The spec field a problem names ("turns" for a turn's)."""
    word = problem.split(":")[0].split(" ")[0]
    return "turns" if word == "turn" else word


def replay_trajectory(spec: TrajectoryReplaySpec, url: str, model: str | None = None,
                      on_progress: Progress | None = None, bounds: Bounds | None = None,
                      stop: threading.Event | None = None, engine: str = "vllm") -> TrajectoryReplayResult:
    """Every variant of `spec`, turn by turn, against the server at `url`; a `ReplayError` naming the
    problem (and the turn), `ReplayStopped` once `stop` is set or past `bounds.replay_s`. Nothing is
    kept from a failed replay."""
    problems = spec.problems()
    if problems:
        raise ReplayError("; ".join(problems), _field_of(problems[0]))
    bounds = bounds or Bounds()
    with open_backend(url, model, bounds, stop, engine) as server:
        info = server.info()
        plans = {v: plan_turns(spec, v) for v in spec.variants}
        ids = _checked_lengths(server, spec, plans, info)
        total = len(spec.turns) * len(plans)
        results = {}
        for variant, (warm, planned) in plans.items():
            done = len(results) * len(spec.turns)
            progress = (lambda k, v=variant, d=done: on_progress(d + k, total, v)) if on_progress else None
            results[variant] = _run_turns(server, spec, warm, planned, ids, progress)
        return TrajectoryReplayResult(server.url, info.model, info.max_model_len,
                                      round(os.getloadavg()[0], 2), results, info.prompt_format,
                                      spec.trajectory_id)


def _checked_lengths(server: Server, spec: TrajectoryReplaySpec, plans: dict,
                     info: ServerInfo) -> dict[str, list[int]]:
    """Every prompt's token ids (warm prompts too), after checking each fits the server."""
    prompts = [(variant, what, content) for variant, (warm, planned) in plans.items()
               for what, content in [("warm-up", warm)] + [(f"turn {t.index + 1}", t.content)
                                                           for t in planned]]
    return checked_lengths(server, prompts, spec.max_tokens, info.max_model_len, "the turns", "turns")


def _run_turns(server: Server, spec: TrajectoryReplaySpec, warm: str, planned: list[PlannedTurn],
               ids: dict[str, list[int]], progress: Callable[[int], None] | None) -> TrajectoryVariantResult:
    variant = planned[0].variant
    cache_reset, before = warm_up(server, variant, warm, spec.max_tokens, spec.choices)
    earlier, turns, cumulative = [ids[warm]], [], 0.0
    for turn in planned:
        try:
            c = server.complete(turn.content, spec.max_tokens, turn.choices)
        except ReplayStopped:
            raise
        except ReplayError as exc:
            raise ReplayError(f"{variant} turn {turn.index + 1} failed: {exc}") from None
        mine = ids[turn.content]
        shared = max(common_prefix(e, mine) for e in earlier)
        earlier.append(mine)
        ttft = round(c.ttft_ms, 1)
        cumulative = round(cumulative + ttft, 1)
        followed = (edit_followed(c.text, [old for _, old, _ in turn.moved],
                                  [new for _, _, new in turn.moved], turn.choices) if turn.moved else None)
        turns.append(TurnHit(index=turn.index, prompt_tokens=c.prompt_tokens, cached_tokens=c.cached_tokens,
                             hit_rate=round(c.cached_tokens / max(1, c.prompt_tokens), 4), ttft_ms=ttft,
                             cumulative_ttft_ms=cumulative, answer=c.text, edit_followed=followed,
                             changed=list(turn.changed), estimated_share=round(shared / max(1, len(mine)), 4),
                             errata=turn.errata))
        if progress:
            progress(len(turns))
    rate = delta(before, server.counters())
    prompt, cached = sum(t.prompt_tokens for t in turns), sum(t.cached_tokens for t in turns)
    return TrajectoryVariantResult(
        turns=turns, hit_rate=round(cached / max(1, prompt), 4), cumulative_ttft_ms=cumulative,
        prompt_tokens=prompt, cached_tokens=cached, followed=sum(t.edit_followed == "new" for t in turns),
        moved_turns=sum(t.edit_followed is not None for t in turns),
        metrics_hit_rate=None if rate is None else round(rate, 4), cache_reset=cache_reset)
