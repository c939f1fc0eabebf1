"""Migration 0005 keeps old results readable: auto's pick is read back from its old detail, the
spread of a run timed once is [ttft, ttft], and edit_followed stays NULL (not measured)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import text

from data.db import make_engine
from data.migrate import alembic_config
from tests.data.conftest import insert_old_run


def test_0005_reads_autos_pick_back_from_its_detail_and_spreads_a_single_timing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    command.upgrade(alembic_config(url), "0004")
    engine = make_engine(url)
    row = ("INSERT INTO run_results (run_id, strategy, decision, choice_probs, kl_to_recompute, top1_agrees, "
           "topk_overlap, logit_cosine, decision_matches_recompute, tokens_computed, latency_ms, text, "
           "detail, ttft_ms) "
           "VALUES (3, :strategy, 'yes', '{}', 0, 1, 10, 1, 1, 40, 80.5, '', :detail, :ttft)")
    with engine.begin() as c:
        insert_old_run(c)
        c.execute(text(row), {"strategy": "auto", "detail": "picked erratum", "ttft": 61.25})
        c.execute(text(row), {"strategy": "selective", "detail": "3 of 20 downstream tokens", "ttft": 70.0})
    command.upgrade(alembic_config(url), "0005")
    with engine.connect() as c:
        rows = c.execute(text("SELECT strategy, picked, ttft_spread_ms, edit_followed FROM run_results "
                              "ORDER BY strategy")).all()
    engine.dispose()
    assert [(r[0], r[1], r[3]) for r in rows] == [("auto", "erratum", None), ("selective", None, None)]
    assert [r[2] for r in rows] in ([[61.25, 61.25], [70.0, 70.0]], ["[61.25, 61.25]", "[70.0, 70.0]"])
