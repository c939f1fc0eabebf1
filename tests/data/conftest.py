"""What the data-layer tests share: a small run snapshot."""

from __future__ import annotations

from data.contracts import RunSnapshot, SnapshotQuestion

SNAPSHOT = RunSnapshot(model="tiny-llama", document="status: active", fields=[], errata=[], placements=[],
                       question=SnapshotQuestion(text="Is it active?", choices=[], cot=False),
                       strategies=["recompute"])
