"""Presentation mode: one run told in four steps, full screen, large type, dark or light —
the document and the edit → what each strategy decided → where the decision looked, against
recompute → which notes carry it — and a fifth, why it moved causally, when the run measured its
mechanism. Every step has its own URL (`/runs/{id}/present/{step}`, the view of step 3 following
`?strategy=…` like the run page); arrow keys, clicks and the links move between them
(`static/js/present.js`), and without scripts the links still do.

Every slide fits the screen above its navigation (what is long scrolls inside its own box), and
every slide names the edit: the field, its old and new value, and the value each answer names
(`answer_values`), so a slide shown alone still says what changed and who followed it."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from markupsafe import Markup

from app.api.deps import SessionDep, get_or_404
from app.web.runs.context import ViewDep, checked_view, run_context
from app.web.runs.heatmap_view import dark_css, div_stops, heatmap_panels, hex_colour, seq_stops
from app.web.runs.view import DecisionRow
from app.web.templating import render
from data.contracts import RunSnapshot
from data.models import Run

router = APIRouter()

STEPS = (
    ("edit", "The document and the edit"),
    ("decisions", "What each strategy decided"),
    ("attention", "Where the decision looked, against recompute"),
    ("notes", "Which notes carry the decision"),
)
MECHANISM_STEP = ("mechanism", "Why the decision moved, causally")  # when the run measured it


@dataclass(frozen=True)
class AnswerValue:
    """One group of the slides' edit line: the strategies whose answers name `value` (`kind` new |
    old | other: how it is drawn)."""

    value: str
    kind: str
    strategies: list[str]


def answer_values(rows: list[DecisionRow], snapshot: RunSnapshot) -> list[AnswerValue]:
    """The value each answer names, grouped, in the order new, old, both, neither: from the run
    page's verdicts (`DecisionRow.followed`). Where answers name no value (a derived yes/no, or no
    field changed), each group is a decision, recompute's first."""
    olds = " / ".join(f.old for f in snapshot.fields)
    news = " / ".join(f.new for f in snapshot.fields)
    named = {"new": (news, "new"), "old": (olds, "old"), "both": ("both values", "other"),
             "neither": ("neither value", "other")}
    groups: dict[tuple[str, str], list[str]] = {}
    shown = [r for r in rows if r.result is not None]
    if any(r.followed for r in shown):
        for key in named:  # in this order
            names = [r.strategy for r in shown if r.followed == key]
            if names:
                groups[named[key]] = names
    else:
        for r in shown:
            groups.setdefault((r.result.decision.strip() or "(no answer)", "other"), []).append(r.strategy)
    return [AnswerValue(value, kind, names) for (value, kind), names in groups.items()]


@router.get("/runs/{run_id}/present")
def present_start(request: Request, run_id: int, session: SessionDep, asked: ViewDep) -> Response:
    return present(request, run_id, 1, session, asked)


@router.get("/runs/{run_id}/present/{step}")
def present(request: Request, run_id: int, step: int, session: SessionDep, asked: ViewDep) -> Response:
    run = get_or_404(session, Run, run_id, "run")
    context = run_context(session, run)
    mechanism = context["mechanism"]
    steps = STEPS + ((MECHANISM_STEP,) if mechanism and mechanism.record.answer else ())
    if not 1 <= step <= len(steps):
        raise HTTPException(
            status_code=404, detail=f"this presentation has steps 1 to {len(steps)}; there is no step {step}"
        )
    view = checked_view(run, context, asked)
    panels = heatmap_panels(session, run.id, view) if view else None
    fields = run.snapshot.fields
    return render(
        request, "present.html", **context, view=view, panels=panels, step=step, steps=steps,
        answer_values=answer_values(context["rows"], run.snapshot),
        query=("?" + view.query_string()) if view and asked.strategy else "",
        first_field=fields[0].start if fields else None,
        seq_ramp=[hex_colour(c) for c in seq_stops()], div_ramp=[hex_colour(c) for c in div_stops()],
        dark_css=Markup(dark_css()),  # generated from the stylesheet's colours, no outside text
    )
