"""Trajectories of a notebook: the request that starts one (`TrajectoryCreate`: the turns and the
strategies), the checks made before anything is saved, starting and cancelling one, and the ONE
typed view every face renders (`TrajectoryView`: the API's answer, the page, the exports).

Checked on the request: at least one turn and at most `KVNOTES_MAX_TURNS`; no empty turn; every
field a turn changes is a labelled field of the notebook; a question for every turn (the turn's,
the request's or the notebook's); the strategies carried across turns (`vocabulary.trajectories`);
a skill a turn places is a compiled skill of the notebook's model, by name (one placed in this
notebook first, else the latest); `auto` applies the notebook's adopted sweep policy (its overall
strategy: a trajectory carries one strategy through every turn, whichever fields they change) and is
refused without one.
Every problem is a 422 naming the turn, and nothing is saved. A turn whose prompt would be past the
model's context is one too (naming the turn and the length), counted with the converted model's own
tokenizer file where the web can read it (`app.services.prompt_length`, torch-free); where it cannot,
the worker checks before the first turn (`worker.engine.trajectory.check`) and fails the trajectory
with the same sentence, before any turn runs. The row is committed before its message is sent
(deleted again if the broker refuses it); the worker's `kvnotes.trajectory` does the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from app.schema_types import (
    AppendText,
    Choices,
    QuestionText,
    SkillName,
    StrategyName,
    Timestamp,
    Value,
    by_label,
)
from app.services.errors import Unprocessable
from app.services.jobs import cancel, check_caps, enqueue_or_unsave
from app.services.notebooks import check_served
from app.services.prompt_length import check_fits
from data.accounts import LOCAL_USER
from data.models import Notebook, RunStatus, Skill
from data.queue import enqueue_trajectory
from data.settings import get_settings
from data.trajectories import Trajectory
from vocabulary.trajectories import (
    FieldSpec,
    SkillSpec,
    Summary,
    TrajectorySpec,
    TurnRecord,
    TurnSpec,
    carried,
    composite,
    judged,
    split_variant,
    summaries,
    unknown_keys,
    verdict,
    with_reference,
)

# what one request body may hold: any body the schema accepts stays under the server's request limit
# (`max_request_bytes`, 3 MiB by default); KVNOTES_MAX_TURNS (64 by default) is checked after
MAX_TURNS_IN_A_BODY = 256


class TurnIn(BaseModel):
    """One turn: text appended, fields changed ({label: value}), a question and its choices, and a
    skill placed before the appended text (a compiled skill of the notebook's model, by name). Every
    text by the text rules (`app.schema_types`): a field's value as a field's (KVNOTES_MAX_VALUE_CHARS)."""

    model_config = ConfigDict(extra="forbid")

    append: AppendText = ""
    fields: by_label(Value, items=32) = Field(default_factory=dict)
    question: QuestionText | None = None
    choices: Choices | None = None
    skill: SkillName | None = None


class TrajectoryCreate(BaseModel):
    """Start a trajectory: the turns in order, the strategies (recompute always included; a strategy
    that appends errata also as `name.one_per_field`; auto only with an adopted policy), and the
    question asked where a turn asks none (None: the notebook's current one, with its choices)."""

    model_config = ConfigDict(extra="forbid")

    turns: list[TurnIn] = Field(min_length=1, max_length=MAX_TURNS_IN_A_BODY)
    strategies: list[StrategyName] = Field(default_factory=lambda: list(carried()), max_length=32)
    question: QuestionText | None = None
    choices: Choices | None = None


def _where(i: int) -> str:
    return f"turns.{i}"


def _skill(notebook: Notebook, name: str) -> Skill | None:
    """The compiled skill of the notebook's model named `name`: one placed in the notebook first,
    else the latest compiled."""
    placed = [p.skill for p in notebook.placements if p.skill.name == name and p.skill.status == "compiled"]
    if placed:
        return placed[0]
    session = object_session(notebook)
    if session is None:
        return None
    return session.scalar(select(Skill).where(Skill.name == name, Skill.model == notebook.model,
                                              Skill.status == "compiled").order_by(Skill.id.desc()).limit(1))


def plan(notebook: Notebook, body: TrajectoryCreate) -> TrajectorySpec:
    """The spec the worker will run, from the notebook as it is now; `Unprocessable` naming the turn."""
    settings = get_settings()
    if len(body.turns) > settings.max_turns:
        raise Unprocessable("turns", f"{len(body.turns)} turns, more than KVNOTES_MAX_TURNS "
                                     f"({settings.max_turns})")
    problem = unknown_keys(body.strategies)
    if problem:
        raise Unprocessable("strategies", problem)
    auto = composite()
    wants_auto = any(split_variant(k)[0] == auto for k in body.strategies)
    if wants_auto and notebook.policy_strategy is None:
        raise Unprocessable("strategies", f"{auto} in a trajectory applies the notebook's adopted sweep "
                                          "policy, and this notebook has none: adopt a finished sweep's "
                                          f"policy, or leave {auto} out")
    fields = sorted((f for f in notebook.fields if f.label.strip()), key=lambda f: f.start)
    labels = [f.label for f in fields]
    if len(set(labels)) != len(labels):
        raise Unprocessable("fields", "two fields of this notebook share a label; a turn names a field by "
                                      "its label, so give each its own")
    current = notebook.question
    question = body.question if body.question is not None else (current.text if current else "")
    if body.choices is not None:
        choices = list(body.choices)
    else:
        choices = list(current.choices) if current is not None and body.question is None else []
    turns, skills = [], {}
    for i, turn in enumerate(body.turns):
        n = i + 1
        if not turn.append and not turn.fields and turn.question is None and turn.skill is None:
            raise Unprocessable(_where(i), f"turn {n} is empty: it appends nothing, changes no field, places "
                                           "no skill and asks nothing")
        if turn.skill is not None and turn.skill not in skills:
            skill = _skill(notebook, turn.skill)
            if skill is None:
                raise Unprocessable(_where(i), f"turn {n} places a skill {turn.skill!r} that is not a "
                                               f"compiled skill of {notebook.model}")
            skills[turn.skill] = SkillSpec(turn.skill, skill.text, skill.id)
        unknown = [label for label in turn.fields if label not in labels]
        if unknown:
            raise Unprocessable(_where(i), f"turn {n} changes a field {unknown[0]!r} that the notebook does "
                                           f"not have (fields: {', '.join(labels) or 'none'})")
        if turn.question is None and not question.strip():
            raise Unprocessable(_where(i), f"turn {n} asks no question and neither the request nor the "
                                           "notebook has one")
        if turn.question is not None and not turn.question.strip():
            raise Unprocessable(_where(i), f"turn {n}'s question is empty")
        turns.append(TurnSpec(append=turn.append, fields=dict(turn.fields), question=turn.question,
                              choices=None if turn.choices is None else tuple(turn.choices),
                              skill=turn.skill))
    if any(not c.strip() for c in choices):
        raise Unprocessable("choices", "a choice is empty")
    return TrajectorySpec(
        model=notebook.model, document=notebook.document,
        fields=tuple(FieldSpec(f.label, f.start, f.end) for f in fields), turns=tuple(turns),
        question=question, choices=tuple(choices), strategies=with_reference(body.strategies),
        skills=tuple(skills.values()), policy=notebook.policy_strategy if wants_auto else None)


def start_trajectory(session: Session, notebook: Notebook, body: TrajectoryCreate,
                     created_by: str = LOCAL_USER) -> Trajectory:
    """Check, save and enqueue a trajectory (`app.services.jobs`: its caps count runs and replays
    too). Raises `Unprocessable` (nothing saved), `RunLimitReached` (rolled back) or
    `QueueUnavailable` (the row deleted again)."""
    check_served(notebook.model, "model")
    spec = plan(notebook, body)
    check_fits(spec)  # a turn past the model's context, where the web can read the model's files
    row = Trajectory(notebook_id=notebook.id, model=notebook.model, spec=spec, status=RunStatus.QUEUED.value,
                     stage="queued", progress=0.0, turns_total=len(spec.turns), turns_done=0, turns=[],
                     created_by=created_by)
    enqueue_or_unsave(session, [row], lambda: enqueue_trajectory(row.id, row.task_id, row.model),
                      check=lambda: check_caps(session, created_by))
    return row


def cancel_trajectory(session: Session, row: Trajectory) -> bool:
    """Cancel an unfinished trajectory (the turns read are kept); False when it already finished."""
    return cancel(session, row, f"cancelled after {row.turns_done} of {row.turns_total} turns; the turns "
                                "read are kept")


class TrajectoryView(BaseModel):
    """A trajectory as every face shows it: where it is, each turn's results per strategy, each
    strategy's summary over the turns read and its verdict in words."""

    id: int
    notebook_id: int | None
    model: str
    status: str
    stage: str
    progress: float
    turns_done: int
    turns_total: int
    error: str | None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    strategies: list[str]
    spec: TrajectorySpec
    turns: list[TurnRecord]
    summary: dict[str, Summary]
    verdicts: dict[str, str]


def trajectory_view(session: Session, row: Trajectory) -> TrajectoryView:
    """The one view of `row`."""
    turns = judged(list(row.turns or []), row.spec)  # the one agreement rule, on old rows too
    summary = summaries(turns)
    return TrajectoryView(
        id=row.id, notebook_id=row.notebook_id, model=row.model, status=row.status, stage=row.stage,
        progress=row.progress, turns_done=row.turns_done, turns_total=row.turns_total, error=row.error,
        created_at=row.created_at, started_at=row.started_at, finished_at=row.finished_at,
        strategies=list(row.spec.strategies), spec=row.spec, turns=turns, summary=summary,
        verdicts={k: verdict(k, s) for k, s in summary.items() if k != row.spec.strategies[0]})

