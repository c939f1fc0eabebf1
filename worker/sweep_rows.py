"""A sweep's side of a worker: the document's notes prefilled once per sweep and worker process
(kept here and in the KV store, counted in `sweeps.document_prefills`), and the sweep's progress
and end written after each of its edits finishes.

Each edit of a sweep is an ordinary run (`kvnotes.run`); what makes it a sweep's is its snapshot's
`sweep_id`. Its edits all start from the same document, so a worker keeps that document's notes
after the first edit it runs and hands them to the engine for the next ones (the engine never
writes into notes it is given). Another worker (or this one after a restart) prefills once more,
reusing what the KV store holds of it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from sqlalchemy import update

from data.contracts import RunSnapshot
from data.db import get_sessionmaker
from data.models import Sweep
from data.sweep_edits import refresh_sweep

if TYPE_CHECKING:
    from worker.engine import Engine, Notes

log = logging.getLogger(__name__)
KEEP = 2  # sweeps whose notes a worker keeps at once (the newest)
_NOTES: OrderedDict[tuple[int, str, str], Notes] = OrderedDict()


def session():
    return get_sessionmaker()()


def sweep_notes(eng: Engine, snapshot: RunSnapshot) -> Notes:
    """The document's notes for an edit of sweep `snapshot.sweep_id`: kept from an earlier edit on
    this worker, or prefilled now (through the KV store) and counted on the sweep."""
    assert snapshot.sweep_id is not None
    key = (snapshot.sweep_id, eng.model_key, hashlib.sha256(snapshot.document.encode()).hexdigest())
    if key in _NOTES:
        _NOTES.move_to_end(key)
        return _NOTES[key]
    notes = eng.prefill(snapshot.document)
    _NOTES[key] = notes
    while len(_NOTES) > KEEP:
        _NOTES.popitem(last=False)
    with session() as s:
        s.execute(update(Sweep).where(Sweep.id == snapshot.sweep_id)
                  .values(document_prefills=Sweep.document_prefills + 1))
        s.commit()
    log.info("sweep: document prefilled on this worker",
             extra={"sweep_id": snapshot.sweep_id, "tokens": notes.n_tokens})
    return notes


def refresh(sweep_id: int | None) -> None:
    """Write the sweep's progress (edits finished) and, once no edit is left to run or to retry,
    its end (`data.sweep_edits.refresh_sweep`): it finishes with what it has and says how many edits
    failed and why. A cancelled sweep stays cancelled."""
    if sweep_id is None:
        return
    try:
        with session() as s:
            refresh_sweep(s, sweep_id)
    except Exception:  # progress is re-derived when the sweep is read; never fail a run for it
        log.exception("sweep: progress not written", extra={"sweep_id": sweep_id})
