"""The home page's notebook cards, one page at a time, in a fixed number of queries whatever the
number of notebooks: the page of notebooks (an excerpt, not the whole document), their field and
skill counts, and their last run's outcome (the run page's headline, from the stored verdicts,
and the best speed-up that stands among the strategies it counts). 10,000 notebooks cost what 24
do, plus one count."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.web.paging import Page
from app.web.runs.verdict_view import Headline, headline
from app.web.runs.view import decision_rows
from data.models import Field, Notebook, Placement, Run, RunResult

CARDS_PER_PAGE = 24
EXCERPT_CHARS = 240


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    status: str
    created_at: datetime
    headline: Headline | None = None  # the run page's, e.g. "3 of 5" "strategies follow the edit, …"
    best_speedup: float | None = None  # among the strategies it counts, when the timing stands
    best_strategy: str | None = None


@dataclass(frozen=True)
class NotebookCard:
    id: int
    title: str
    model: str
    excerpt: str
    updated_at: datetime
    fields: int
    skills: int
    last_run: RunOutcome | None


def notebook_cards(session: Session, number: int, path: str = "/") -> tuple[Page, list[NotebookCard]]:
    total = session.scalar(select(func.count(Notebook.id))) or 0
    page = Page(number, CARDS_PER_PAGE, total, path)
    if number > page.pages:
        page = Page(page.pages, CARDS_PER_PAGE, total, path)
    rows = session.execute(
        select(Notebook.id, Notebook.title, Notebook.model, func.substr(Notebook.document, 1, EXCERPT_CHARS),
               Notebook.updated_at)
        .order_by(Notebook.updated_at.desc(), Notebook.id.desc()).limit(page.size).offset(page.offset)
    ).all()
    ids = [r[0] for r in rows]
    fields = _counts(session, Field.notebook_id, ids)
    skills = _counts(session, Placement.notebook_id, ids)
    outcomes = last_run_outcomes(session, ids)
    cards = [NotebookCard(i, title, model, excerpt or "", updated, fields.get(i, 0), skills.get(i, 0),
                          outcomes.get(i))
             for i, title, model, excerpt, updated in rows]
    return page, cards


def _counts(session: Session, column, ids: list[int]) -> dict[int, int]:
    if not ids:
        return {}
    return dict(session.execute(select(column, func.count()).where(column.in_(ids)).group_by(column)).all())


def last_run_outcomes(session: Session, notebook_ids: list[int]) -> dict[int, RunOutcome]:
    """Each notebook's newest run and, when it succeeded, its agreement and best speed-up; the
    results are read column by column (never the attention blobs or the snapshot)."""
    if not notebook_ids:
        return {}
    newest = (select(func.max(Run.id)).where(Run.notebook_id.in_(notebook_ids), Run.sweep_id.is_(None))
              .group_by(Run.notebook_id))  # a sweep's edits are the sweep's
    runs = session.execute(
        select(Run.id, Run.notebook_id, Run.status, Run.created_at).where(Run.id.in_(newest))
    ).all()
    results: dict[int, list] = {}
    query = select(RunResult.run_id, RunResult.strategy, RunResult.decision_matches_recompute,
                   RunResult.top1_agrees, RunResult.tokens_computed, RunResult.ttft_ms, RunResult.latency_ms,
                   RunResult.ttft_spread_ms, RunResult.edit_followed, RunResult.decision,
                   ).where(RunResult.run_id.in_([r.id for r in runs])).order_by(RunResult.id)
    for row in session.execute(query):
        results.setdefault(row.run_id, []).append(row)
    out = {}
    for run in runs:
        rows = decision_rows(SimpleNamespace(results=results.get(run.id, []), strategies=[]))
        ref = next((r.result for r in rows if r.is_reference and r.result is not None), None)
        line = headline(rows, has_fields=getattr(ref, "edit_followed", None) is not None)
        counted = line is not None and bool(line.count)
        best = max((r for r in rows if counted and not r.is_reference and r.agrees and r.speedup
                    and r.timing is None), key=lambda r: r.speedup, default=None)
        out[run.notebook_id] = RunOutcome(run.id, run.status, run.created_at, line,
                                          best.speedup if best else None, best.strategy if best else None)
    return out
