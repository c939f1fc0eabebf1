"""The run task's reading of a snapshot into engine arguments, without a broker."""

from __future__ import annotations

import pytest

SNAPSHOT = {
    "model": "tiny-llama",
    "document": "status: active\nOnly active users may log in.\n",
    "fields": [{"start": 8, "end": 14, "old": "active", "new": "closed", "label": "status"}],
    "errata": ["[STATE UPDATE] status is now closed.\n"],
    "placements": [],
    "question": {"text": "Can the user log in?", "choices": ["yes", "no"], "cot": False},
    "strategies": ["recompute", "erratum"],
}


def test_snapshot_becomes_engine_arguments_and_the_token_limit_is_enforced(isolated):
    isolated()
    from data.contracts import RunSnapshot
    from worker.engine import EngineError, load
    from worker.mapping import run_request

    eng = load("tiny-llama")
    snapshot = RunSnapshot.model_validate(SNAPSHOT)
    request = run_request(eng, snapshot)
    assert request.fields[0].new_value == "closed" and request.question.choices == ("yes", "no")
    assert request.errata == tuple(SNAPSHOT["errata"])
    n_tokens = len(SNAPSHOT["document"]) + 1  # byte tokens + the start token
    isolated(KVNOTES_MAX_DOCUMENT_TOKENS=str(n_tokens - 1))
    with pytest.raises(EngineError,
                       match=f"the document is {n_tokens} tokens on tiny-llama; the limit is {n_tokens - 1}"):
        run_request(eng, snapshot)
