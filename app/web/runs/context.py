"""What the run page shows, gathered once for the page and for everything that shows the same
run elsewhere (the exports, the standalone report, the presentation): the decision rows, answers,
attention strategies, notes map; and the attention view a URL names (`?strategy=&layer=&head=&agg=
&query=`), checked against the run (422 naming the parameter when it cannot be shown)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.services.errors import Unprocessable
from app.services.runs import waits_without_worker, worker_step
from app.web.runs.heatmap_view import ViewParams, view_params
from app.web.runs.mechanism_view import MechanismPanel, mechanism_panel
from app.web.runs.notes_map_view import MapPiece, lead_parts, notes_map_pieces, remaining, top_spans
from app.web.runs.regions_view import RegionsPanel, regions_panel
from app.web.runs.verdict_view import Headline, headline, order_flag
from app.web.runs.view import (
    DecisionRow,
    SnapshotPiece,
    agreement_summary,
    answer_of,
    decision_rows,
    default_strategy,
    measured_decode,
    measured_ttft,
    run_note,
    snapshot_pieces,
    word_diff,
)
from data.contracts import NotesMap, NotesSpan, RunSnapshot
from data.models import Notebook, Run
from vocabulary import METRICS, REFERENCE


@dataclass(frozen=True)
class AskedView:
    strategy: str | None = None
    layer: int | None = None
    head: int | None = None
    agg: str | None = None
    query: int | None = None


def asked_view(
    strategy: str | None = None, layer: int | None = Query(default=None, ge=0),
    head: int | None = Query(default=None, ge=0), agg: str | None = None,
    query: int | None = Query(default=None, ge=0, description="question/answer token number, from 0"),
) -> AskedView:
    return AskedView(strategy, layer, head, agg, query)


ViewDep = Annotated[AskedView, Depends(asked_view)]


@dataclass(frozen=True)
class AnswerDiff:
    """One strategy's answer, word by word against recompute's."""

    row: DecisionRow
    diff: list[tuple[str, str]]
    same: bool


@dataclass(frozen=True)
class RunPage:
    """What the run page shows, and the exports, the report and the presentation show the same:
    one typed context, built once per request by `run_context` (the attention by region panel is
    filled for the run page only, by `run_page_context`). Templates receive it whole: `keys()` and
    `[]` let `render(..., **page)` spread its fields as the template's names."""

    run: Run
    rows: list[DecisionRow]
    agree: int
    compared: int
    answers: list[AnswerDiff]
    headline: Headline | None
    snapshot: RunSnapshot
    pieces: list[SnapshotPiece]
    notebook: Notebook | None
    no_live_worker: bool
    attention_strategies: list[str]
    attention_shape: list[int] | None
    default_strategy: str | None
    note: str
    order_flag: str | None
    mechanism: MechanismPanel | None
    ttft_measured: bool
    decode_measured: bool  # the answers were decoded past the first token (`view.measured_decode`)
    metric_help: dict[str, str]
    notes_map: NotesMap | None
    map_pieces: list[MapPiece]
    top_spans: list[NotesSpan]
    map_lead: list[tuple[str, bool]]
    map_remaining: float
    previous_run_id: int | None
    regions: RegionsPanel | None = None
    worker_step: str | None = None  # what the worker still does before it can take this queued run

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


def checked_view(run: Run, context: RunPage | dict[str, Any], asked: AskedView) -> ViewParams | None:
    """The view `asked` names, or the run's default; None when the run has no attention."""
    try:
        return view_params(run, context["attention_strategies"], context["default_strategy"], asked.strategy,
                           asked.layer, asked.head, asked.agg, asked.query)
    except Unprocessable as exc:
        raise HTTPException(
            status_code=422, detail=f"This run cannot show that view: {exc.message}."
        ) from None


def run_page_context(session: Session, run: Run) -> RunPage:
    """The run page's context: `run_context` and the attention by region panel."""
    return replace(run_context(session, run), regions=regions_panel(session, run) if run.results else None)


def run_context(session: Session, run: Run) -> RunPage:
    """What the run page shows (the exports and the report show the same)."""
    rows = decision_rows(run)
    agree, compared = agreement_summary(rows)
    by_name = {r.strategy: r for r in run.results}
    reference = by_name.get(REFERENCE)
    answers = []
    for row in rows:
        if row.result is None:
            continue
        text = answer_of(row.result)
        diff = (word_diff(answer_of(reference), text) if reference is not None and not row.is_reference
                else [("equal", text)])
        answers.append(AnswerDiff(row, diff, all(op == "equal" for op, _ in diff)))
    with_attention = [r.strategy for r in run.results if r.attention_shape]
    notes_map = run.attribution
    return RunPage(
        run=run, rows=rows, agree=agree, compared=compared, answers=answers,
        headline=headline(rows, bool(run.snapshot.fields)),
        snapshot=run.snapshot, pieces=snapshot_pieces(run.snapshot),
        notebook=session.get(Notebook, run.notebook_id) if run.notebook_id else None,
        no_live_worker=waits_without_worker(session, run), worker_step=worker_step(session, run),
        attention_strategies=with_attention, attention_shape=_shape(run),
        default_strategy=default_strategy(rows, with_attention), note=run_note(rows, run.snapshot),
        order_flag=order_flag(rows),
        ttft_measured=measured_ttft(run), decode_measured=measured_decode(run),
        metric_help={m.name: m.help for m in METRICS},
        mechanism=mechanism_panel(run.mechanism),
        notes_map=notes_map, map_pieces=notes_map_pieces(run.snapshot, notes_map) if notes_map else [],
        top_spans=top_spans(notes_map) if notes_map else [],
        map_lead=lead_parts(run.snapshot, notes_map) if notes_map else [],
        map_remaining=remaining(notes_map) if notes_map else 0.0,
        previous_run_id=session.scalar(select(func.max(Run.id)).where(  # never a sweep's edit
            Run.notebook_id == run.notebook_id, Run.id < run.id, Run.sweep_id.is_(None)))
        if run.notebook_id else None,
    )


def _shape(run: Run) -> list[int] | None:
    for r in run.results:
        if r.attention_shape:
            return [int(n) for n in r.attention_shape]
    return None


