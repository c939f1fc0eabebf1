"""Serving replays from a notebook: the request that starts one (its field, the values it takes,
the server and the load), the checks made before anything is saved, and starting it.

Everything a replay can know before its first request is checked here, synchronously: the notebook
has a field and a question, the values are among the question's choices (or the choices are
extended with them, on request), the values and the load are sensible, the server answers, serves the
model and fits every prompt (`serving.preflight`). A failed check is a 422 naming the problem, and
nothing is saved; the replay row is committed before its message is sent (deleted again if the
broker refuses it). The worker's `kvnotes.replay` does the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schema_types import Integer, Number
from app.services.errors import Unprocessable
from data.accounts import LOCAL_USER
from data.models import Notebook, RunStatus, as_utc, utcnow
from data.queue import QueueUnavailable, enqueue_replay, revoke
from data.replays import Replay, ReplaySnapshot
from data.settings import get_settings
from serving import ReplayError, ReplaySpec, preflight
from vocabulary.replay import VARIANTS
from vocabulary.verdicts import words

MAX_VALUES = 64
MAX_REQUESTS = 256


class ReplayCreate(BaseModel):
    """A replay of the notebook's field edit on a vLLM server. Unset: the server of `KVNOTES_VLLM_URL`
    (and `KVNOTES_VLLM_MODEL`), the notebook's first field, its new value as the only value."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(default="", max_length=500, description="the server, e.g. http://127.0.0.1:8100/v1")
    model: str = Field(default="", max_length=200, description="the served model ('' = the one it serves)")
    field_id: Integer | None = Field(default=None, description="the field that changes (default: the first)")
    values: list[str] = Field(default_factory=list, max_length=MAX_VALUES,
                              description="the values the field takes, one per request, in turn")
    requests: Integer = Field(default=0, ge=0, le=MAX_REQUESTS, description="per variant (0: one per value)")
    rate: Number = Field(default=1.0, gt=0, le=1000, description="Poisson arrivals, requests per second")
    concurrency: Integer = Field(default=4, ge=1, le=64, description="requests in flight at most")
    variants: list[str] = Field(default_factory=lambda: list(VARIANTS), min_length=1,
                                max_length=len(VARIANTS))
    max_tokens: Integer = Field(default=16, ge=1, le=256, description="answer tokens per request")
    extend_choices: bool = Field(default=False, description="values outside the question's choices are "
                                 "added to the choices this replay sends (else such values are refused)")


def outside_choices(values: list[str], choices: list[str], field_values: list[str]) -> list[str]:
    """The values no choice names, when the choices name the field's values (a choice is its old or
    new value; yes/no choices name none and take any value): those answers could never agree."""
    said = {tuple(words(choice)) for choice in choices}
    if not any(tuple(words(value)) in said for value in field_values):
        return []
    return list(dict.fromkeys(value for value in values if tuple(words(value)) not in said))


def snapshot_for(notebook: Notebook, body: ReplayCreate) -> ReplaySnapshot:
    """What the replay will send, from the notebook as it is now; `Unprocessable` naming the field
    of the request to blame."""
    settings = get_settings()
    url = body.url.strip() or settings.vllm_url
    if not url:
        raise Unprocessable("url", "no vLLM server: give its URL (or set KVNOTES_VLLM_URL); "
                                   "scripts/vllm.sh starts one")
    fields = sorted(notebook.fields, key=lambda f: f.start)
    chosen = [f for f in fields if body.field_id is None or f.id == body.field_id][:1]
    if not chosen:
        raise Unprocessable("field_id", "this notebook has no field to replay; mark one in the document"
                            if body.field_id is None else f"field {body.field_id} is not in this notebook")
    question = notebook.question
    if question is None:
        raise Unprocessable("question", "this notebook has no question yet; ask one first")
    field = chosen[0]
    values = [v.strip() for v in body.values if v.strip()] or [field.new_value]
    choices = list(question.choices)
    missing = outside_choices(values, choices, [notebook.document[field.start:field.end], field.new_value])
    if missing and not body.extend_choices:
        raise Unprocessable("values", f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                            f"among the question's choices ({', '.join(choices)}): every answer is one of "
                            "them, so those requests could never agree; add them to the choices, or "
                            "extend the choices for this replay")
    return ReplaySnapshot(url=url, model=body.model.strip() or settings.vllm_model,
                          document=notebook.document, start=field.start, end=field.end,
                          label=field.label or "the value", values=values, question=question.text,
                          choices=choices + missing, extended_choices=missing, requests=body.requests,
                          rate=body.rate, concurrency=body.concurrency, variants=list(body.variants),
                          max_tokens=body.max_tokens)


def start_replay(session: Session, notebook: Notebook, body: ReplayCreate,
                 created_by: str = LOCAL_USER) -> Replay:
    """Check, save and enqueue a replay. Raises `Unprocessable` (nothing saved) or `QueueUnavailable`
    (the row deleted again)."""
    snapshot = snapshot_for(notebook, body)
    try:
        info = preflight(ReplaySpec.of(snapshot.model_dump()), snapshot.url, snapshot.model or None)
    except ReplayError as exc:
        raise Unprocessable(exc.field, str(exc)) from None
    snapshot = snapshot.model_copy(update={"model": info.model})
    replay = Replay(notebook_id=notebook.id, snapshot=snapshot, status=RunStatus.QUEUED.value, stage="queued",
                    progress=0.0, created_by=created_by)
    session.add(replay)
    session.commit()
    try:
        enqueue_replay(replay.id, replay.task_id, notebook.model)
    except QueueUnavailable:
        session.delete(replay)
        session.commit()
        raise
    return replay


def replays_of(session: Session, notebook_id: int, limit: int = 20) -> list[Replay]:
    """The notebook's replays, newest first (one that can no longer finish is failed first)."""
    query = select(Replay).where(Replay.notebook_id == notebook_id).order_by(Replay.id.desc()).limit(limit)
    return [settled(session, replay) for replay in session.scalars(query)]


def settled(session: Session, replay: Replay) -> Replay:
    """The replay, failed with the reason when it is still queued or running past the worker's time
    limit (`KVNOTES_TASK_TIME_LIMIT`): its worker died or its message was lost, and it never ends
    in silence."""
    limit_s = get_settings().task_time_limit_s + 60
    if replay.is_finished or (utcnow() - as_utc(replay.created_at)).total_seconds() < limit_s:
        return replay
    replay.status, replay.finished_at = RunStatus.FAILED.value, utcnow()
    replay.error = (f"the replay did not finish within {limit_s} s (KVNOTES_TASK_TIME_LIMIT + 60 s): its "
                    "worker stopped or its message was lost; start it again")
    session.commit()
    return replay


def cancel_replay(session: Session, replay: Replay) -> bool:
    """Mark an unfinished replay cancelled and revoke its message; False (nothing changed) when it
    already finished. The worker stops at its next finished request and keeps no result."""
    if replay.is_finished:
        return False
    replay.status, replay.stage, replay.finished_at = RunStatus.CANCELLED.value, "cancelled", utcnow()
    session.commit()
    if replay.task_id:
        revoke(replay.task_id)
    return True
