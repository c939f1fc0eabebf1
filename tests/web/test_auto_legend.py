"""The run page says what auto was: with no adopted policy, an oracle pick that costs every probe;
with the notebook's adopted policy in the run's snapshot, only that strategy, at its cost."""

from __future__ import annotations

from tests.web.conftest import page_run, session


def test_the_decision_tables_legend_says_whether_auto_was_an_oracle_pick_or_the_adopted_policy(make_client):
    from data.models import Run, RunResult

    client = make_client()
    _, _, run = page_run(client, strategies=("recompute", "stale", "auto"))
    s = session()
    row = s.query(RunResult).filter_by(run_id=run.id, strategy="auto").one()
    row.picked = "stale"
    s.commit()
    page = client.get(f"/runs/{run.id}").text
    assert page.count("data-auto-legend") == 1 and "an oracle pick, with no sweep behind it" in page
    stored = s.get(Run, run.id)
    stored.snapshot = stored.snapshot.model_copy(update={"policy": "stale"})
    s.commit()
    page = client.get(f"/runs/{run.id}").text
    assert "it ran only <code>stale</code>" in page and "oracle pick" not in page
