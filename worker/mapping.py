"""The worker's two translations, written out field by field: a run snapshot (the web's typed
record) into the engine's `RunRequest`, and the engine's `Report` into `run_results` rows.
"""

from __future__ import annotations

import numpy as np

from data.accounts import LOCAL_USER
from data.contracts import (
    EditSpan,
    MechanismRecord,
    NotesMap,
    NotesSpan,
    RunSnapshot,
    SnapshotPlacement,
    StoreReuse,
    TokenRecord,
)
from data.models import RunResult, Skill
from data.settings import get_settings
from vocabulary import METRIC_NAMES
from worker.engine import (
    Engine,
    EngineError,
    Field,
    Notes,
    Placement,
    Question,
    Report,
    RunRequest,
    StrategyResult,
)
from worker.engine.mechanism.types import Mechanism
from worker.engine.store_tiers import Reuse
from worker.engine.types import Attention, Attribution
from worker.run_rows import session


def store_owner(user: str | None) -> str | None:
    """Whose notes the KV store keys a job's by (`LoadedModel.scoped`): None under
    KVNOTES_STORE_SCOPE=deployment (shared by everyone), else the job's user ("local" when none is
    recorded: a run from before the snapshot carried it, or a single-user install)."""
    if get_settings().store_scope != "user":
        return None
    return user or LOCAL_USER


def unowned_job_store(eng: Engine):
    """The context a job that records no user (a trajectory) runs its engine work in: the
    deployment's notes, or under KVNOTES_STORE_SCOPE=user no store at all, so neither its reads nor
    its timing tell anyone what another user prefilled (it prefills, and compiles its skills, anew)."""
    from contextlib import nullcontext

    from worker.engine.engine import no_store

    return nullcontext() if get_settings().store_scope != "user" else no_store(eng)


def run_request(eng: Engine, snapshot: RunSnapshot) -> RunRequest:
    """What the engine runs for `snapshot`; a document over the token limit is refused."""
    limit = get_settings().max_document_tokens
    n_tokens = len(eng.tokenize_document(snapshot.document)[0])
    if n_tokens > limit:
        raise EngineError(
            f"the document is {n_tokens} tokens on {eng.info.alias}; the limit is {limit} "
            "(KVNOTES_MAX_DOCUMENT_TOKENS)"
        )
    q = snapshot.question
    return RunRequest(
        document=snapshot.document,
        question=Question(q.text, tuple(q.choices), q.cot),
        fields=tuple(Field(f.start, f.end, f.new, f.label) for f in snapshot.fields),
        strategies=tuple(snapshot.strategies),
        errata=tuple(snapshot.errata) if snapshot.errata else None,
        placements=tuple(
            Placement(text=p.text, at=p.position, notes=compiled_skill(eng, p)) for p in snapshot.placements
        ),
        attention=True,
        attribution=snapshot.attribution,
        mechanism=snapshot.mechanism,
        policy=snapshot.policy,
    )


def compiled_skill(eng: Engine, placement: SnapshotPlacement) -> Notes | None:
    """The placed skill's compiled notes from the KV store, or None (the engine then compiles it)
    when the skill is gone, its text changed since the snapshot, or its notes are not stored."""
    return stored_skill_notes(eng, placement.skill_id, placement.text)


def stored_skill_notes(eng: Engine, skill_id: int | None, text: str) -> Notes | None:
    """The compiled notes the skill row `skill_id` keeps in the KV store, while its text is still
    `text`; None when there is no row, its text changed, or its notes are not stored."""
    if skill_id is None:
        return None
    with session() as s:
        skill = s.get(Skill, skill_id)
        key = skill.store_key if skill is not None and skill.text == text else None
    return eng.stored_skill(key, text) if key else None


def result_row(run_id: int, strategy: str, result: StrategyResult, attention: Attention | None) -> RunResult:
    """One `run_results` row: the metrics column by column (`vocabulary.METRICS` names both sides),
    the decision's attention as float16 bytes [layers, heads, T], every question and answer token's
    attention as float16 [Q, T], and the tokens as typed records."""
    row = RunResult(run_id=run_id, strategy=strategy)
    for name in METRIC_NAMES:
        setattr(row, name, getattr(result, name))
    if attention is not None:
        weights = np.ascontiguousarray(attention.weights, dtype=np.float16)  # [layers, heads, T]
        row.attention = weights.tobytes()
        row.attention_shape = list(weights.shape)
        row.tokens = [
            TokenRecord(id=t.id, text=t.text, start=t.start, end=t.end, segment=t.segment)
            for t in attention.tokens
        ]
        row.decision_index = attention.decision
        row.query_start = attention.query_start
        # [Q, T]
        row.query_attention = np.ascontiguousarray(attention.query_weights, dtype=np.float16).tobytes()
    return row


def result_rows(run_id: int, report: Report) -> list[RunResult]:
    return [result_row(run_id, name, result, report.attention.get(name))
            for name, result in report.strategies.items()]


def mechanism_record(mechanism: Mechanism | None) -> MechanismRecord | None:
    """The engine's mechanism views as the `runs.mechanism` record, field by field."""
    if mechanism is None:
        return None
    return MechanismRecord.model_validate(mechanism, from_attributes=True)


def store_reuse_record(reuse: Reuse | None) -> StoreReuse | None:
    """The engine's store lookup for the run's document as the `runs.store_reuse` record."""
    if reuse is None:
        return None
    return StoreReuse(tokens=reuse.tokens, tier=reuse.tier or "none", shared_tier=reuse.shared_fault)


def notes_map_record(attribution: Attribution | None) -> NotesMap | None:
    """The engine's notes map as the `runs.attribution` record (character offsets, shares)."""
    if attribution is None:
        return None
    return NotesMap(
        field_share=attribution.field_share,
        kl_stale=attribution.kl_stale,
        kl_in_place=attribution.kl_in_place,
        spans=[NotesSpan(start_char=s.start_char, end_char=s.end_char, text=s.text, share=s.share)
               for s in attribution.spans],
        edits=[EditSpan(start_char=e.start_char, end_char=e.end_char, share=e.share)
               for e in attribution.edits],
    )
