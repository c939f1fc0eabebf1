"""What the data-layer tests share: a small run snapshot."""

from __future__ import annotations

from data.contracts import RunSnapshot, SnapshotQuestion

SNAPSHOT = RunSnapshot(model="tiny-llama", document="status: active", fields=[], errata=[], placements=[],
                       question=SnapshotQuestion(text="Is it active?", choices=[], cot=False),
                       strategies=["recompute"])


OLD_SNAPSHOT = ('{"model": "m", "document": "abc", "fields": [], "errata": [], "placements": [], '
                '"question": {"text": "q?", "choices": [], "cot": false}, "strategies": ["recompute"]}')


def insert_old_run(connection) -> None:
    """Run 3, succeeded, as the first release wrote a run row (raw SQL: no ORM of a later revision)."""
    from sqlalchemy import text

    connection.execute(text("INSERT INTO runs (id, kind, snapshot, strategies, status, stage, progress, "
                            "timings, created_at) VALUES (3, 'edit', :s, '[\"recompute\"]', 'succeeded', "
                            "'done', 1, '{}', CURRENT_TIMESTAMP)"), {"s": OLD_SNAPSHOT})
