"""Trajectories: a document and ordered turns, each strategy carrying its OWN cache forward.

A turn may append text (a tool result, a message), change fields (label -> value) and ask a question
(the trajectory's question when it asks none). At every turn, for every strategy:

1. what the turn appends is prefilled onto the strategy's cache, as an agent's server does;
2. the field changes are applied by the strategy itself: its own `surgery` (its file under
   `strategies/edits/`) on an `EditCase` whose old notes are the strategy's cache as it stands
   (document, appended turns, errata) and whose new tokens are that cache with the document's values
   changed; an erratum it appends lands after the last turn's text. With the `one_per_field`
   variant the field's earlier erratum is first cut from the cache (later keys re-rotated);
3. the decision is read after the cache with the readout's `decide` (choices over their cyclic
   orders, as a run reads them) and compared with recompute's (`compare.fidelity`).

A turn may place a skill (`Turn.skill`), before what it appends. Its notes are compiled once before
the turns (the stored ones reused), outside the timings as a run's skills are. A strategy that is
not exact splices them after its cache (keys re-rotated to their place, O(L), the paper's
composition): `tokens_spliced` counts them, `tokens_computed` does not, and the rotation and the copy
are inside its TTFT. Exact strategies prefill the skill's text as part of the prompt.

How a strategy's cache moves to the next turn is its descriptor's `carrying` (`worker.engine.carry`),
never its name. `OWN_SURGERY` is the above. `FIELDS_LAST` (hoist) carries the hoisted layout
(`vocabulary.trajectories.hoisted_prompt`): the document without its fields' lines, prefilled once
before the turns as its deployment would (untimed, like every strategy's document notes), then each
turn's text, then the field block, kept last: every turn the block is dropped from the end, the
turn's text prefilled and the block with the current values prefilled again (computed every turn,
changed or not), as an exact prefix cache serves that layout. `FOLLOWS_POLICY` (auto) carries the
strategy the notebook's adopted sweep policy names (`TrajectoryRequest.policy`), at that strategy's
cost; without a policy it is refused (its oracle pick would have to carry every probe's cache
through every turn).

`WHOLE_PROMPT` strategies (the exact ones, recompute and prefix_reuse) hold the whole current
prompt, tokenized as one text each turn: recompute prefills it all again, prefix_reuse keeps the
notes up to the first token that differs. Nothing is deferred to the readout here (`carry`): a cache
carried forward must be complete before the next turn. `tokens_computed` counts the tokens a
strategy ran through the model for its cache at that turn (the question's tokens, the same for all,
are not counted); `ttft_ms` is from the turn's start to the decision's first token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vocabulary import DEFAULT_TEMPLATE, REFERENCE, render_erratum
from vocabulary.agreement import Agreement, agreement
from vocabulary.strategies import FIELDS_LAST, FOLLOWS_POLICY, WHOLE_PROMPT
from vocabulary.trajectories import (
    StrategyTurn,
    Summary,
    TrajectorySpec,
    TurnRecord,
    default_keys,
    split_variant,
    summaries,
    unknown_keys,
    verdict,
    with_reference,
)
from vocabulary.verdicts import edit_followed
from worker.engine.carry import Carried, advance, document_with, lay_out_hoisted
from worker.engine.compare import fidelity
from worker.engine.loaded import LoadedModel
from worker.engine.notes import Notes, cache_from_layers
from worker.engine.readout import decide, orders_suffixes
from worker.engine.strategies import EDITS, Strategy
from worker.engine.types import EngineError, Field, Question


@dataclass(frozen=True)
class Turn:
    """One turn: a skill placed (its name; None: none), text appended, fields changed ((label,
    value) pairs), a question (None: the trajectory's)."""

    append: str = ""
    fields: tuple[tuple[str, str], ...] = ()
    question: Question | None = None
    skill: str | None = None


@dataclass(frozen=True)
class TurnSkill:
    """A skill the turns may place: its name, its text and its compiled notes (`compile_skill`:
    sink first; None: compiled before the turns)."""

    name: str
    text: str
    notes: Notes | None = None


@dataclass(frozen=True)
class TrajectoryRequest:
    """A document with labelled fields (their spans; the document holds their first values), the
    turns, the question asked where a turn asks none, the strategy keys (`vocabulary.trajectories`),
    the skills the turns place and the adopted sweep policy auto applies (None: auto is refused)."""

    document: str
    fields: tuple[Field, ...]
    turns: tuple[Turn, ...]
    question: Question | None = None
    strategies: tuple[str, ...] = default_keys()
    erratum_template: str = DEFAULT_TEMPLATE
    skills: tuple[TurnSkill, ...] = ()
    policy: str | None = None


@dataclass
class TrajectoryReport:
    model: str
    document_tokens: int
    turns: list[TurnRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Summary]:
        return summaries(self.turns)

    def verdicts(self) -> dict[str, str]:
        return {k: verdict(k, s) for k, s in self.summary().items() if k != REFERENCE}


def check(engine: LoadedModel, request: TrajectoryRequest) -> list[str]:
    """The strategy keys, recompute first, after checking the request: every problem is one line
    naming the turn (an unknown label, an empty turn, no question, a prompt past the context)."""
    problem = unknown_keys(request.strategies)
    if problem:
        raise EngineError(problem)
    _policy(request)
    labels = {f.label for f in request.fields}
    if "" in labels or len(labels) != len(request.fields):
        raise EngineError("every field of a trajectory needs a label of its own")
    if not request.turns:
        raise EngineError("a trajectory needs at least one turn")
    context = getattr(engine.model.config, "max_position_embeddings", None)
    values = {f.label: request.document[f.start:f.end] for f in request.fields}
    appended, errata = "", 0
    skills = {s.name: s for s in request.skills}
    for i, turn in enumerate(request.turns, 1):
        if not turn.append and not turn.fields and turn.question is None and turn.skill is None:
            raise EngineError(f"turn {i} is empty: it appends nothing, changes no field, places no skill "
                              "and asks nothing")
        if turn.skill is not None and turn.skill not in skills:
            raise EngineError(f"turn {i} places a skill {turn.skill!r} that the trajectory does not have "
                              f"(skills: {', '.join(sorted(skills)) or 'none'})")
        for label, value in turn.fields:
            if label not in values:
                raise EngineError(f"turn {i} changes a field {label!r} that the document does not have "
                                  f"(fields: {', '.join(sorted(values)) or 'none'})")
            if value != values[label]:
                errata += len(engine.encode(render_erratum(label, values[label], value,
                                                           request.erratum_template)))
            values[label] = value
        question = turn.question or request.question
        if question is None or not question.text.strip():
            raise EngineError(f"turn {i} asks no question and the trajectory has none")
        appended += (skills[turn.skill].text if turn.skill is not None else "") + turn.append
        if context:
            length = (len(engine.tokenize_document(document_with(request, values) + appended)[0]) + errata
                      + len(engine.encode(engine.frame.suffix(question))) + 8)
            if length > context:
                raise EngineError(f"turn {i}: the prompt would be {length} tokens (errata included), past "
                                  f"the model's context of {context}")
    return list(with_reference(request.strategies))


def _policy(request: TrajectoryRequest) -> str | None:
    """The strategy auto carries: the adopted policy when a key asks for auto (an `EngineError` when
    none is adopted, or it names no plain strategy), else None."""
    asked = [k for k in request.strategies
             if EDITS.classes[split_variant(k)[0]].info.carrying == FOLLOWS_POLICY]
    if not asked:
        return None
    if request.policy is None:
        raise EngineError(f"{asked[0]} in a trajectory applies the notebook's adopted sweep policy, and "
                          "none is adopted: adopt a finished sweep's policy (kvnotes trajectory --policy "
                          "NAME), or name the strategies yourself")
    cls = EDITS.classes.get(request.policy)
    if cls is None or cls.info.carrying in ("", FOLLOWS_POLICY):
        raise EngineError(f"the adopted policy {request.policy!r} names no plain strategy "
                          f"(valid: {', '.join(n for n in default_keys())})")
    return request.policy


def _build(keys: list[str], policy: str | None = None) -> dict[str, tuple[Strategy, bool]]:
    """Each key's strategy object and its erratum variant: the composite's (`FOLLOWS_POLICY`) is the
    policy's strategy; a strategy that lays the document out again before its edits is refused unless
    its carrying lays that out too (`FIELDS_LAST`)."""
    built = {}
    for key in keys:
        name, one = split_variant(key)
        if EDITS.classes[name].info.carrying == FOLLOWS_POLICY:
            if policy is None:
                raise EngineError(f"{name} needs an adopted sweep policy in a trajectory")
            name = policy
        strategy = EDITS.build([name])[name]
        if type(strategy).prepare is not Strategy.prepare and strategy.info.carrying != FIELDS_LAST:
            raise EngineError(f"{name} lays the document out again before its edits; a trajectory does "
                              "not carry it yet")
        built[key] = (strategy, one)
    return built


def trajectory(engine: LoadedModel, request: TrajectoryRequest, notes: Notes | None = None,
               progress: Callable[[int, TurnRecord], None] | None = None,
               cancelled: Callable[[], bool] = lambda: False) -> TrajectoryReport:
    """Every turn of `request` by every strategy, each carrying its own cache; `notes` are the
    document's cached notes (prefilled when None). `progress(turn, report)` after each turn;
    `cancelled()` is asked before each turn (True stops with the turns read so far)."""
    keys = check(engine, request)
    built = _build(keys, _policy(request))
    placed = {t.skill for t in request.turns if t.skill is not None}
    if any(s.info.moves_keys for s, _ in built.values()) or (
            placed and not all(s.info.carrying == WHOLE_PROMPT for s, _ in built.values())):
        engine.require_portable()
    old = notes if notes is not None else engine.prefill(request.document)
    # the skills the turns place, compiled once outside the timings (a run's skills are too)
    compiled = {s.name: s.notes if s.notes is not None else engine.compile_skill(s.text)
                for s in request.skills if s.name in placed}
    engine.warm_up()
    first = {f.label: request.document[f.start:f.end] for f in request.fields}
    states = {k: Carried(k, s, one, list(old.token_ids), list(old.segments), list(old.offsets), old.layers,
                          len(old.token_ids), dict(first), dict(first)) for k, (s, one) in built.items()}
    for state in states.values():
        if state.strategy.info.carrying == FIELDS_LAST:
            lay_out_hoisted(engine, request, state, old, first)
    report = TrajectoryReport(model=engine.info.alias, document_tokens=len(old.token_ids))
    texts = {s.name: s.text for s in request.skills}
    values, appended, previous = dict(first), "", dict(first)
    held: list[str] = []  # every value a field has held so far: what an answer may name
    for index, turn in enumerate(request.turns):
        if cancelled():
            break
        changed = [label for label, value in turn.fields if value != values[label]]
        for label in changed:
            previous[label] = values[label]
        values.update(dict(turn.fields))
        appended += (texts[turn.skill] if turn.skill is not None else "") + turn.append
        full = engine.tokenize_document(document_with(request, values) + appended)
        question = turn.question or request.question
        suffix = engine.encode(engine.frame.suffix(question))
        orders = orders_suffixes(engine.tokenizer, engine.frame, question)
        moved = [label for label in values if values[label] != first[label]]
        def followed(answer: str, q: Question = question, moved: list[str] = moved) -> str | None:
            if not moved:
                return None
            return edit_followed(answer, [previous[m] for m in moved], [values[m] for m in moved], q.choices)

        held.extend(v for v in values.values() if v not in held)

        def judged(answer: str, reference: str, first_token: bool, q: Question = question,
                   known: tuple[str, ...] = tuple(held)) -> Agreement:  # the one rule
            return agreement(answer, reference, choices=q.choices, values=known, first_token=first_token)

        tr = TurnRecord(index=index, prompt_tokens=len(full[0]), changed=changed)
        readouts = {}
        for key, state in states.items():
            t0 = time.perf_counter()
            computed = advance(engine, request, state, turn.append, values, changed, full, appended,
                                compiled.get(turn.skill) if turn.skill is not None else None)
            readout = decide(engine.model, engine.tokenizer, engine.frame,
                             cache_from_layers(state.layers, engine.model), suffix, question, orders=orders)
            ttft = (readout.first_token_at - t0) * 1000
            state.cumulative_ttft_ms += ttft
            state.cumulative_tokens += computed
            readouts[key] = (readout, computed, ttft)
        ref = readouts[REFERENCE][0]
        for key, (readout, computed, ttft) in readouts.items():
            state, fid = states[key], fidelity(ref.logits, readout.logits)
            judgement = judged(readout.decision, ref.decision, fid.top1_agrees)
            tr.results[key] = StrategyTurn(
                decision=readout.decision, agrees=judgement.agrees, basis=judgement.basis,
                edit_followed=followed(readout.decision), kl_to_recompute=fid.kl_to_recompute,
                logit_cosine=fid.logit_cosine, tokens_computed=computed, ttft_ms=ttft,
                cumulative_ttft_ms=state.cumulative_ttft_ms, cache_tokens=len(state.ids),
                cumulative_tokens=state.cumulative_tokens, errata=state.n_errata,
                tokens_spliced=state.spliced)
        report.turns.append(tr)
        if progress is not None:
            progress(index, tr)
    return report


def request_of(spec: TrajectorySpec, compiled: dict[str, Notes] | None = None) -> TrajectoryRequest:
    """The engine's request for a stored or written trajectory (`vocabulary.trajectories`): a turn
    with a question of its own asks it with its own choices (none: a free answer); `compiled`: the
    skills' stored notes by name (a skill without is compiled before the turns)."""
    fields = tuple(Field(f.start, f.end, spec.document[f.start:f.end], f.label) for f in spec.fields)
    turns = tuple(Turn(append=t.append, fields=tuple(t.fields.items()),
                       question=None if t.question is None else Question(t.question, tuple(t.choices or ())),
                       skill=t.skill)
                  for t in spec.turns)
    skills = tuple(TurnSkill(s.name, s.text, (compiled or {}).get(s.name)) for s in spec.skills)
    return TrajectoryRequest(spec.document, fields, turns, Question(spec.question, tuple(spec.choices)),
                             tuple(spec.strategies), skills=skills, policy=spec.policy)
