"""The words of a trajectory, torch-free: which strategies carry their notes across turns, the
errata policy variants, a strategy's summary over the turns and the verdict in words.

A trajectory is a document and ordered turns; each turn may append text, change fields and ask a
question, and every strategy carries its own cache from turn to turn (`worker.engine.trajectory`).
A strategy that appends errata runs in two variants: `name` keeps every erratum it appended, and
`name.one_per_field` keeps one erratum per field, for its current value (the earlier one is cut
from the cache and the new one appended after the last turn's text).

A turn may also place a skill (`TurnSpec.skill`, one of the trajectory's `skills` by name): it goes
after the cache as it stands, before the turn's appended text. Non-exact strategies splice the
skill's precompiled notes there (re-rotated, no token computed); exact ones prefill its text as part
of the prompt. `hoist` keeps its field block (the fields' lines, `hoisted_prompt`) after the last
turn's text; `auto` applies the adopted sweep policy (`TrajectorySpec.policy`) and is refused without one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from vocabulary.agreement import FIRST_TOKEN, WORDS, agreement, by_verdict
from vocabulary.hoist import hoist
from vocabulary.strategies import EDIT_INFO, FLOOR, FOLLOWS_POLICY, REFERENCE, StrategyInfo
from vocabulary.sweeps import wilson
from vocabulary.text_rules import unrenderable

ONE_PER_FIELD = "one_per_field"  # the variant that keeps one erratum per field
VARIANT_SEP = "."


def carried(infos: dict[str, StrategyInfo] = EDIT_INFO) -> tuple[str, ...]:
    """The edit strategies a trajectory carries across turns, each its own cache: every one whose
    descriptor says how (`StrategyInfo.carrying`) with a cache of its own. Those that edit the notes
    they hold carry them as they are (`OWN_SURGERY`), the exact ones the whole prompt
    (`WHOLE_PROMPT`); one that lays the document out again once before its edits carries that layout,
    its fields' lines kept after the last turn's text (`FIELDS_LAST`, `hoisted_prompt`). The one that
    follows the adopted sweep policy (`FOLLOWS_POLICY`, the composite) is accepted too (`accepted`):
    it is no default, being refused without a policy. tests/engine/test_trajectory.py checks that the
    engine builds every one."""
    return tuple(name for name, info in infos.items() if info.carrying not in ("", FOLLOWS_POLICY))


def accepted(infos: dict[str, StrategyInfo] = EDIT_INFO) -> tuple[str, ...]:
    """Every strategy a trajectory may be asked for: the carried ones and the one following the policy."""
    return (*carried(infos), composite(infos))


def default_keys(infos: dict[str, StrategyInfo] = EDIT_INFO) -> tuple[str, ...]:
    """The strategies a trajectory runs when none are named: every carried one (not the
    composite, which needs an adopted policy)."""
    return carried(infos)


def composite(infos: dict[str, StrategyInfo] = EDIT_INFO) -> str:
    """The name of the strategy that carries the adopted sweep policy's (auto)."""
    return next(name for name, info in infos.items() if info.carrying == FOLLOWS_POLICY)


def split_variant(key: str) -> tuple[str, bool]:
    """(strategy name, keeps one erratum per field) of a trajectory strategy key."""
    name, _, policy = key.partition(VARIANT_SEP)
    return name, policy == ONE_PER_FIELD


def unknown_keys(keys: Sequence[str], infos: dict[str, StrategyInfo] = EDIT_INFO) -> str:
    """'' when every key is an accepted strategy (or its one_per_field variant), else one line
    naming the bad ones and the valid ones."""
    valid = accepted(infos)
    bad = []
    for key in keys:
        name, _, policy = key.partition(VARIANT_SEP)
        if name not in valid or (policy and (policy != ONE_PER_FIELD or not infos[name].appends_errata)):
            bad.append(key)
    if not bad:
        return ""
    errata = ", ".join(n for n in valid if n in infos and infos[n].appends_errata)
    return (f"unknown trajectory strategies: {', '.join(map(repr, bad))}; valid: {', '.join(valid)} "
            f"(the ones that append errata, {errata}, also as name{VARIANT_SEP}{ONE_PER_FIELD})")


def with_reference(keys: Sequence[str]) -> tuple[str, ...]:
    """`keys` with the reference first, each once."""
    return tuple(dict.fromkeys([REFERENCE, *keys]))


@dataclass(frozen=True)
class FieldSpec:
    """A labelled field of the document: [start, end) holds its first value."""

    label: str
    start: int
    end: int


@dataclass(frozen=True)
class TurnSpec:
    """One turn as written (the API's body, a JSONL line): text appended, fields changed
    ({label: value}), a question and its choices (None: the trajectory's), and a skill placed (its
    name among the trajectory's `skills`; it goes before the appended text)."""

    append: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    question: str | None = None
    choices: tuple[str, ...] | None = None
    skill: str | None = None


@dataclass(frozen=True)
class SkillSpec:
    """A skill a turn may place: its name (what `TurnSpec.skill` says), its text, and the skill row
    whose compiled notes the worker reuses while its text is the same (None: compiled for the run,
    outside the timings, as the CLI does)."""

    name: str
    text: str
    skill_id: int | None = None


@dataclass(frozen=True)
class TrajectorySpec:
    """What a trajectory runs: the notebook's model, document and fields as they were, the turns,
    the question asked where a turn asks none, and the strategy keys (the reference first). The web
    app writes it, the `trajectories.spec` column stores it, the worker and the CLI run it."""

    model: str
    document: str
    fields: tuple[FieldSpec, ...]
    turns: tuple[TurnSpec, ...]
    question: str
    choices: tuple[str, ...]
    strategies: tuple[str, ...]
    skills: tuple[SkillSpec, ...] = ()  # the skills the turns place, by name
    policy: str | None = None  # the adopted sweep policy auto applies (None: auto is refused)


TURN_KEYS = ("append", "fields", "question", "choices", "skill")


def turns_from_jsonl(text: str) -> list[TurnSpec]:
    """The turns of a JSONL text, one a line (blank lines skipped): {"append": …, "fields": {label:
    value}, "question": …, "choices": […], "skill": name}. `ValueError` naming the line for a bad one."""
    turns = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {n} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or set(row) - set(TURN_KEYS):
            raise ValueError(f"line {n} must be an object with only {', '.join(TURN_KEYS)}")
        where = unrenderable(row)  # JSON can spell a lone surrogate ("\ud800"); no page can show one
        if where is not None:
            raise ValueError(f"line {n}: {where} is not valid Unicode (a lone surrogate such as \\ud800)")
        fields = row.get("fields") or {}
        if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
            raise ValueError(f"line {n}: fields must be {{label: value}} with text values")
        question, choices = row.get("question"), row.get("choices")
        if question is not None and not isinstance(question, str):
            raise ValueError(f"line {n}: question must be text")
        texts = isinstance(choices, list) and all(isinstance(c, str) for c in choices)
        if choices is not None and not texts:
            raise ValueError(f"line {n}: choices must be a list of texts")
        append = row.get("append") or ""
        if not isinstance(append, str):
            raise ValueError(f"line {n}: append must be text")
        skill = row.get("skill")
        if skill is not None and (not isinstance(skill, str) or not skill.strip()):
            raise ValueError(f"line {n}: skill must be a skill's name")
        turns.append(TurnSpec(append=append, fields=dict(fields), question=question,
                              choices=None if choices is None else tuple(choices), skill=skill))
    if not turns:
        raise ValueError("no turns: write one turn a line")
    return turns


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    new_value: str


def hoisted_prompt(document: str, fields: Sequence[FieldSpec], values: dict[str, str],
                   appended: str) -> tuple[str, str]:
    """hoist's prompt at a turn, as (kept, block): `kept` is the document without its fields' lines
    (`vocabulary.hoist`) followed by every turn's text so far, `block` is those lines holding the
    fields' current values, after a newline when the text before does not end with one. An agent's
    server that hoists keeps the block last: each turn its cache drops the block (at the end, so
    nothing moves), prefills the turn's text and prefills the block again; the prefix before the
    block is never recomputed, and the block is, every turn, changed or not."""
    laid = hoist(document, [_Span(f.start, f.end, values[f.label]) for f in fields])
    kept = laid.text[:laid.tail_start] + appended
    block = laid.tail
    if block and kept and not kept.endswith("\n"):
        block = "\n" + block
    return kept, block


@dataclass
class StrategyTurn:
    """One strategy at one turn (the API's `turns[i].results[strategy]`)."""

    decision: str
    agrees: bool
    edit_followed: str | None
    kl_to_recompute: float
    logit_cosine: float
    tokens_computed: int
    ttft_ms: float
    cumulative_ttft_ms: float
    cache_tokens: int
    cumulative_tokens: int
    errata: int  # errata the cache holds
    tokens_spliced: int = 0  # a placed skill's tokens spliced in: none computed, their keys re-rotated
    # what `agrees` compared (`vocabulary.agreement`): "value", "choice", "first token", "words";
    # "" on turns stored before the rule, which `judged` re-reads
    basis: str = ""


@dataclass
class TurnRecord:
    """One turn read: recompute's prompt length, the labels it changed, every strategy's result."""

    index: int
    prompt_tokens: int
    changed: list[str]
    results: dict[str, StrategyTurn] = field(default_factory=dict)


def judged(turns: Sequence[TurnRecord], spec: TrajectorySpec | None = None) -> list[TurnRecord]:
    """`turns` with every `agrees` under the one rule (`vocabulary.agreement`). Turns stored before
    it compared the wording: with `spec`, each is judged again from its answers and the values the
    fields have held so far ("The account status is suspended." and "The account is suspended."
    name the same value); without it, from the stored verdicts. Where recompute's answer names no
    value, the stored comparison stands, labelled."""
    held = [spec.document[f.start:f.end] for f in spec.fields] if spec is not None else []
    out = []
    for i, t in enumerate(turns):
        turn = spec.turns[i] if spec is not None and i < len(spec.turns) else None
        if turn is not None:
            held.extend(v for v in turn.fields.values() if v not in held)
        choices = (turn.choices or ()) if turn is not None and turn.question else \
            (spec.choices if spec is not None else ())
        ref = t.results.get(REFERENCE)
        results = {}
        for k, r in t.results.items():
            if ref is not None and k != REFERENCE and (spec is not None or not r.basis):
                stored = r.basis if r.basis in (FIRST_TOKEN, WORDS) else WORDS
                a = agreement(r.decision, ref.decision, choices=choices, values=held) \
                    if spec is not None else by_verdict(r.edit_followed, ref.edit_followed, r.agrees,
                                                        fallback_basis=stored)
                if a.basis in (FIRST_TOKEN, WORDS) and r.basis in (FIRST_TOKEN,):
                    a = replace(a, agrees=r.agrees, basis=r.basis)  # the engine's first-token reading
                r = replace(r, agrees=a.agrees, basis=a.basis)
            results[k] = r
        out.append(replace(t, results=results))
    return out


def summaries(turns: Sequence[TurnRecord], spec: TrajectorySpec | None = None) -> dict[str, Summary]:
    """Each strategy's summary over `turns`, against the reference's, with its agreement on the
    turns that changed recompute's decision (`decisive_turns`)."""
    turns = judged(turns, spec)
    keys = list(turns[0].results) if turns else []
    points = {k: [TurnPoint(r.agrees, r.kl_to_recompute, r.cumulative_ttft_ms, r.cumulative_tokens)
                  for r in (t.results[k] for t in turns)] for k in keys}
    decisive = decisive_turns(turns, judge=False)
    return {k: summarize(points[k], points.get(REFERENCE, []), decisive) for k in keys}


def decisive_turns(turns: Sequence[TurnRecord], spec: TrajectorySpec | None = None,
                   judge: bool = True) -> list[bool] | None:
    """Per turn: whether its changes so far changed recompute's decision, as a sweep counts its
    changed edits: recompute's decision there differs from the floor's (stale keeps the document's
    own values under the same turns). A turn with no change of decision (no edit, or a value set
    back) is trivial: every strategy that ignores the edits agrees on it. None without the floor."""
    if not turns or any(FLOOR not in t.results for t in turns):
        return None
    return [not t.results[FLOOR].agrees for t in (judged(turns, spec) if judge else turns)]


@dataclass(frozen=True)
class TurnPoint:
    """One strategy at one turn, as the summary reads it."""

    agrees: bool
    kl_to_recompute: float
    cumulative_ttft_ms: float
    cumulative_tokens: int


@dataclass(frozen=True)
class Summary:
    """One strategy over every turn read so far."""

    turns: int
    agreed: int
    agreement: float
    agreement_ci95: tuple[float, float] | None
    cumulative_ttft_ms: float
    cumulative_speedup: float | None  # recompute's cumulative TTFT over this one's
    cumulative_tokens: int
    max_kl: float
    # on the turns that changed recompute's decision (None: the trajectory did not run the floor)
    changed_turns: int | None = None
    changed_agreed: int | None = None
    changed_ci95: tuple[float, float] | None = None


def summarize(points: Sequence[TurnPoint], reference: Sequence[TurnPoint],
              decisive: Sequence[bool] | None = None) -> Summary:
    """The summary of one strategy's turns against the reference's turns; with `decisive` (per
    turn, whether it changed recompute's decision) its agreement on those turns too."""
    n = len(points)
    agreed = sum(p.agrees for p in points)
    cum = points[-1].cumulative_ttft_ms if points else 0.0
    ref_cum = reference[-1].cumulative_ttft_ms if reference else 0.0
    moved = [p for p, d in zip(points, decisive, strict=False) if d] if decisive is not None else None
    moved_agreed = sum(p.agrees for p in moved) if moved is not None else None
    return Summary(
        turns=n, agreed=agreed, agreement=agreed / n if n else 0.0, agreement_ci95=wilson(agreed, n),
        cumulative_ttft_ms=cum, cumulative_speedup=ref_cum / cum if cum > 0 and ref_cum > 0 else None,
        cumulative_tokens=points[-1].cumulative_tokens if points else 0,
        max_kl=max((p.kl_to_recompute for p in points), default=0.0),
        changed_turns=len(moved) if moved is not None else None, changed_agreed=moved_agreed,
        changed_ci95=wilson(moved_agreed, len(moved)) if moved else None,
    )


def verdict(key: str, s: Summary) -> str:
    """One sentence: 'on the 4 turns that changed recompute's decision field_erratum agreed on 4 (27
    of 28 turns in all) and drifted at most KL 0.02, for 9.1x less cumulative TTFT' (without the
    floor in the trajectory: 'over 28 turns field_erratum agreed on 27 and …')."""
    cost = ""
    if s.cumulative_speedup is not None:
        cost = (f", for {s.cumulative_speedup:.1f}x less cumulative TTFT" if s.cumulative_speedup >= 1
                else f", for {1 / s.cumulative_speedup:.1f}x more cumulative TTFT")
    if s.changed_turns:
        agreed = (f"on the {s.changed_turns} turn{'' if s.changed_turns == 1 else 's'} that changed "
                  f"recompute's decision {key} agreed on {s.changed_agreed} ({s.agreed} of {s.turns} "
                  "turns in all)")
    elif s.changed_turns == 0:
        agreed = (f"no turn changed recompute's decision: {key} agreed on {s.agreed} of {s.turns} turns, "
                  "none of them telling")
    else:
        agreed = f"over {s.turns} turns {key} agreed on {s.agreed}"
    return f"{agreed} and drifted at most KL {s.max_kl:.2g}{cost}"
