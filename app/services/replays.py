"""Serving replays from a notebook: the request that starts one (its field, the values it takes,
the server and the load), the checks made before anything is saved, and starting it.

Checked on the request, within seconds: the server is one the operator configured
(`KVNOTES_VLLM_URL`; any server only for the operator at the keyboard of the embedded default, and
never a database's or broker's port, a link-local or unspecified address: `replay_target`), the
notebook has a field and a question, the values are among the question's choices (or the choices
are extended with them, on request), the load is sensible, the caps hold (`app.services.jobs`: a
user's runs, trajectories and replays count together), and the server answers and serves the model
(`serving.preflight`: 5 s at most, `CHECKS_AT_ONCE` per process, so servers that do not answer
cannot hold the app's request slots). The prompts' lengths are checked by the worker before its
first request. A failed check is a 422 naming the problem (a 429 for a cap), and nothing is saved;
the replay row is committed before its message is sent (deleted again if the broker refuses it).
Its message goes to the replays' own queue (`data.queue.REPLAY_QUEUE`), served by a small thread
pool, never by a model's worker: a replay is HTTP calls, and never delays a run. The task
`kvnotes.replay` does the rest.

A trajectory is replayed the same way (`start_trajectory_replay`): its document, fields, turns and
question as stored, one request per turn and variant; the same server checks, caps and queue, and a
spec that cannot run is a 422 naming the turn (`turns.{i}`). Its row is the notebook's (deleted
with it) and names the trajectory in its snapshot (`replays_of_trajectory`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from itertools import islice

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schemas import ReplayCreate, TrajectoryReplayCreate
from app.services.errors import RunLimitReached, Unprocessable
from app.services.jobs import cancel, check_caps, enqueue_or_unsave
from data.accounts import LOCAL_USER, count_users
from data.models import Notebook, RunStatus
from data.queue import enqueue_replay
from data.replays import AnySpec, Replay
from data.settings import get_settings
from data.trajectories import Trajectory
from serving import Bounds, ReplayError, preflight
from serving.server import base_url
from vocabulary.replay import ReplaySpec, TrajectoryReplaySpec
from vocabulary.trajectories import SkillSpec
from vocabulary.verdicts import outside_choices

CHECKS_AT_ONCE = 2  # replays checked against their servers at once per process; more get a 429 at once
_checking = threading.BoundedSemaphore(CHECKS_AT_ONCE)


def replay_target(url: str, free: bool) -> str:
    """The server a replay may reach: `url` when it is one the operator configured
    (`KVNOTES_VLLM_URL`), or any reachable address when `free` (the operator at the keyboard), or
    the first configured server when `url` is empty. `Unprocessable` on "url" otherwise, and for an
    address no replay may reach (a database's or broker's port, link-local, unspecified, a URL with a
    password: `serving.targets`), before any connection."""
    settings = get_settings()
    configured = settings.vllm_urls
    given = url.strip() or (configured[0] if configured else "")
    if not given:
        raise Unprocessable("url", "no vLLM server is configured: the operator sets KVNOTES_VLLM_URL "
                                   "(scripts/vllm.sh starts one)" + ("; or give its URL" if free else ""))
    try:
        root = base_url(given, settings.service_ports)
    except ReplayError as exc:
        raise Unprocessable("url", str(exc)) from None
    if not free and root not in {_root(u) for u in configured}:
        raise Unprocessable("url", "a replay reaches only the vLLM servers this server's operator configured "
                                   f"(KVNOTES_VLLM_URL): {', '.join(configured) or 'none yet'}")
    return root


def _root(url: str) -> str | None:
    try:
        return base_url(url)
    except ReplayError:
        return None


def at_the_keyboard(session: Session, via: str) -> bool:
    """Whether the person asking is the operator: the embedded default's local user (sign-in off on
    a loopback bind, for a loopback client) while no account exists."""
    return via == "local" and count_users(session) == 0


def snapshot_for(notebook: Notebook, body: ReplayCreate, free: bool = False) -> ReplaySpec:
    """What the replay will send, from the notebook as it is now; `Unprocessable` naming the field
    of the request to blame. `free`: any server may be named (`replay_target`)."""
    settings = get_settings()
    url = replay_target(body.url, free)
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
    return ReplaySpec(url=url, model=body.model.strip() or settings.vllm_model,
                      document=notebook.document, start=field.start, end=field.end,
                      label=field.label or "the value", values=tuple(values), question=question.text,
                      choices=tuple(choices + missing), extended_choices=tuple(missing),
                      requests=body.requests, rate=body.rate, concurrency=body.concurrency,
                      variants=tuple(body.variants), max_tokens=body.max_tokens)


def start_replay(session: Session, notebook: Notebook, body: ReplayCreate,
                 created_by: str = LOCAL_USER, free: bool = False) -> Replay:
    """Check, save and enqueue a replay. Raises `Unprocessable` (nothing saved), `RunLimitReached`
    (the caps, or too many replays being checked at once: 429) or `QueueUnavailable` (the row
    deleted again). `free`: the asker may name any server (`at_the_keyboard`)."""
    return _saved(session, notebook.id, snapshot_for(notebook, body, free), created_by)


def trajectory_snapshot(row: Trajectory, body: TrajectoryReplayCreate,
                        free: bool = False) -> TrajectoryReplaySpec:
    """What the trajectory's replay will send: its document, fields, turns, question and skills as
    stored; `Unprocessable` naming the turn (`turns.{i}`) or the field of the request to blame."""
    spec = row.spec
    snapshot = TrajectoryReplaySpec(
        document=spec.document, fields=tuple(spec.fields), turns=tuple(spec.turns), question=spec.question,
        choices=tuple(spec.choices), variants=tuple(body.variants), max_tokens=body.max_tokens,
        url=replay_target(body.url, free), model=body.model.strip() or get_settings().vllm_model,
        trajectory_id=row.id, skills=tuple(SkillSpec(s.name, s.text) for s in spec.skills))
    problems = snapshot.problems()
    if problems:
        turn = re.match(r"turn (\d+)", problems[0])
        raise Unprocessable(f"turns.{int(turn.group(1)) - 1}" if turn else problems[0].split(":")[0],
                            f"trajectory {row.id}: {problems[0]}")
    return snapshot


def start_trajectory_replay(session: Session, row: Trajectory, body: TrajectoryReplayCreate,
                            created_by: str = LOCAL_USER, free: bool = False) -> Replay:
    """Check, save and enqueue a replay of the trajectory `row` (as `start_replay`)."""
    return _saved(session, row.notebook_id, trajectory_snapshot(row, body, free), created_by)


def _saved(session: Session, notebook_id: int | None, snapshot: AnySpec, created_by: str) -> Replay:
    """The caps, the server's preflight, the row committed, then its message sent (the row deleted
    again when the broker refuses it)."""
    check_caps(session, created_by, counting_itself=False)  # cheap: before the server is checked
    if not _checking.acquire(blocking=False):
        raise RunLimitReached(f"{CHECKS_AT_ONCE} replays are being checked against their servers right "
                              "now; try again in a few seconds")
    try:  # seconds at most (serving.preflight's bounds), and never more than CHECKS_AT_ONCE requests
        info = preflight(snapshot, snapshot.url, snapshot.model or None,
                         Bounds(connect_s=2.0, request_s=3.0, replay_s=5.0,
                                refused_ports=tuple(get_settings().service_ports)))
    except ReplayError as exc:
        raise Unprocessable(exc.field, str(exc)) from None
    finally:
        _checking.release()
    snapshot = snapshot.replace(model=info.model)
    replay = Replay(notebook_id=notebook_id, snapshot=snapshot, status=RunStatus.QUEUED.value, stage="queued",
                    progress=0.0, created_by=created_by)
    enqueue_or_unsave(session, [replay], lambda: enqueue_replay(replay.id, replay.task_id),
                      check=lambda: check_caps(session, created_by))
    return replay


def _newest(session: Session, notebook_id: int | None, limit: int,
            keep: Callable[[Replay], bool]) -> list[Replay]:
    """The newest `limit` replays (of the notebook, or of every notebook for None) that `keep` keeps:
    which trajectory a replay replays is read from its typed snapshot, never by SQL on the JSON
    (PostgreSQL's JSON operators fail on a row holding a lone surrogate, saved before the text rules
    held, and would fail the list for everyone)."""
    query = select(Replay).order_by(Replay.id.desc()).execution_options(yield_per=50)
    if notebook_id is not None:
        query = query.where(Replay.notebook_id == notebook_id)
    return list(islice((r for r in session.scalars(query) if keep(r)), limit))


def replays_of(session: Session, notebook_id: int, limit: int = 20, edits_only: bool = False) -> list[Replay]:
    """The notebook's replays, newest first; `edits_only`: not those of its trajectories."""
    return _newest(session, notebook_id, limit, lambda r: not edits_only or r.trajectory_id is None)


def replays_of_trajectory(session: Session, trajectory_id: int, limit: int = 20) -> list[Replay]:
    """The trajectory's replays, newest first: rows of its notebook (of any, once it is gone)."""
    row = session.get(Trajectory, trajectory_id)
    notebook_id = row.notebook_id if row is not None else None
    return _newest(session, notebook_id, limit, lambda r: r.trajectory_id == trajectory_id)


def cancel_replay(session: Session, replay: Replay) -> bool:
    """Mark an unfinished replay cancelled and revoke its message; False (nothing changed) when it
    already finished. The worker stops at its next finished request and keeps no result."""
    return cancel(session, replay)
