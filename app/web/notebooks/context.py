"""What the notebook page and its fragments need from the database, gathered in one place:
the notebook, its document view, the compiled skills for its model, its runs, and the token
spans of the latest finished run that still fits the document; the runs' history, a page at a time."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.services.errors import Gone
from app.services.notebooks import load_for_page
from app.web.notebooks.document_view import build_document_view, tokens_for_document
from app.web.notebooks.examples import example_named
from app.web.paging import paginate
from app.web.runs.verdict_view import headline
from app.web.runs.view import decision_rows
from app.web.templating import approx_tokens, render
from data.contracts import TokenRecord
from data.models import Notebook, Run, RunStatus, Skill, notebook_runs


def latest_tokens(session: Session, notebook: Notebook) -> tuple[Run | None, list[TokenRecord]]:
    """The newest succeeded run of this notebook on this very document, and its fitting tokens."""
    runs = session.scalars(notebook_runs(notebook.id).where(Run.status == RunStatus.SUCCEEDED).limit(5))
    for run in runs:
        if run.snapshot.document == notebook.document:
            tokens = tokens_for_document(notebook.document, run.results)
            if tokens:
                return run, tokens
    return None, []


HISTORY_PER_PAGE = 10


def decision_summary(session: Session, run: Run | None) -> dict[str, Any] | None:
    """What the notebook shows under its latest run once it succeeded, without a click: the run
    page's headline and one line per strategy (its verdict, its answer, its speed-up): the decision
    rows and the headline alone, not the whole run page."""
    if run is None or run.status != RunStatus.SUCCEEDED or not run.results:
        return None
    rows = decision_rows(run)
    return {"run_id": run.id, "headline": headline(rows, bool(run.snapshot.fields)),
            "rows": [r for r in rows if r.result]}


def notebook_context(session: Session, notebook: Notebook, history_number: int = 1,
                     sweeps: bool = False, **extra: Any) -> dict[str, Any]:
    """Everything the notebook page renders. The history lists the notebook's own runs; with
    `sweeps` its sweeps' edits too (each marked as its sweep's). The latest run (the progress box,
    the decision summary, "Latest run") is always the notebook's own."""
    load_for_page(notebook)
    token_run, tokens = latest_tokens(session, notebook)
    doc_token_count = sum(1 for t in tokens if t.segment == "document")
    skills = list(
        session.scalars(
            select(Skill).where(Skill.model == notebook.model, Skill.status == "compiled")
            .order_by(Skill.name)
        )
    )
    runs = notebook_runs(notebook.id)
    listed = notebook_runs(notebook.id, sweeps=sweeps)
    history_page, history = paginate(session, listed, history_number, HISTORY_PER_PAGE,
                                     f"/notebooks/{notebook.id}", param="history", fragment="history",
                                     keep=(("sweeps", "1"),) if sweeps else ())
    recent_runs = (history if history_page.number == 1 and not sweeps
                   else list(session.scalars(runs.limit(HISTORY_PER_PAGE))))
    sweep_edits = session.scalar(select(func.count(Run.id)).where(  # cancelled edits never ran: not counted
        Run.notebook_id == notebook.id, Run.sweep_id.is_not(None), Run.status != "cancelled")) or 0
    context: dict[str, Any] = {
        "notebook": notebook,
        "example": example_named(notebook.example),  # its description heads the page
        "view": build_document_view(notebook.document, notebook.fields, notebook.placements, tokens or None),
        "skills": skills,
        "recent_runs": recent_runs,  # the newest runs (the latest drives the progress box)
        "history": history,  # the runs on the history page asked for
        "history_page": history_page,
        "history_sweeps": sweeps,  # whether the history lists the sweeps' edits
        "sweep_edits": sweep_edits,  # how many there are (hidden unless asked for)
        "question": notebook.question,
        "has_tokens": bool(tokens),
        "token_run": token_run,
        "tokens_exact": bool(tokens),
        "doc_tokens": doc_token_count or approx_tokens(notebook.document),
        "values": {},
        "errors": {},
        "nav": "notebooks",
    }
    context.update(extra)
    return context


def regions(request: Request, session: Session, notebook: Notebook, **extra: Any) -> Response:
    """After a successful edit: every region that depends on fields, errata and placements, swapped
    out of band; the element that sent the request is left alone (HX-Reswap: none)."""
    if session.get(Notebook, notebook.id, populate_existing=True) is None:  # deleted since the edit
        raise Gone(f"notebook {notebook.id} was deleted")
    response = render(request, "_regions.html", **notebook_context(session, notebook, oob=True, **extra))
    response.headers["HX-Reswap"] = "none"
    return response
