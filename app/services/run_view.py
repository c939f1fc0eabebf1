"""A run's one view: `RunOut`, the JSON API's shape, built here from the database and nowhere else.

`GET /api/runs/{id}` answers it, `/runs/{id}/export.json` embeds it as `run`, and the offline
report carries it in its data as `run`, so the three are the same object (a test holds them
equal). The page's own figures (decision rows, verdicts, the notes map drawn over the document) are
built from the same rows by `app.web.runs.context`.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.schemas import RunOut, StrategyResultOut
from app.services.attention import run_attention_regions
from data.models import Run

_BUILT = {"results", "timings", "attention_regions"}  # filled below; every other field is the row's own


def run_out(run: Run, attention_regions: dict[str, dict[str, float]] | None = None) -> RunOut:
    """The run's row as its view, with the decision's attention by region when given (a run just
    started, re-run or cancelled has none yet)."""
    own = {name: getattr(run, name) for name in RunOut.model_fields if name not in _BUILT}
    return RunOut(
        **own,
        timings=run.timings or {},
        results={r.strategy: StrategyResultOut.model_validate(r) for r in run.results},
        attention_regions=attention_regions or {},
    )


def run_view(session: Session, run: Run) -> RunOut:
    """The run, its results and the decision's attention by region per strategy, mean over layers
    and heads (`{strategy: {region: share}}`; {} for a run that kept no attention)."""
    fields = [(f.start, f.end) for f in run.snapshot.fields] if run.snapshot else []
    regions = run_attention_regions(session, run.id, fields)
    return run_out(run, {name: shares.mean for name, shares in regions.items()})
